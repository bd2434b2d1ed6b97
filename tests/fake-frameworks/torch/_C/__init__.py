"""torch._C of the fake torch: the out-of-memory observer hook."""

_oom_observers = []


def _cuda_attach_out_of_memory_observer(observer):
    _oom_observers.append(observer)
