# A `torch` whose import fails (as a wheel with a missing shared library does): gpucollect must
# not activate anything, and the program sees the ImportError as it would without gpucollect.
raise ImportError("fake torch: libtorch_cuda.so: cannot open shared object file")
