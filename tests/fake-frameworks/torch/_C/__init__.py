"""torch._C of the fake torch: the out-of-memory observer hook and the C++ ABI flag."""

# The real torch._C says which libstdc++ ABI its C++ was built with.
_GLIBCXX_USE_CXX11_ABI = True

_oom_observers = []


def _cuda_attach_out_of_memory_observer(observer):
    _oom_observers.append(observer)
