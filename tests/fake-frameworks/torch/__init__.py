# A package named `torch` for gpucollect's tests: importing it must activate gpucollect's
# framework capture. It holds no tensors.
__version__ = "0.0.0+gpucollect.fake"
