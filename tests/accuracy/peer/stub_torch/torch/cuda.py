"""`torch.cuda` of the stub: no CUDA device here; every memory query raises."""

from . import _no_gpu


def is_available():
    return False


def device_count():
    return 0


current_device = _no_gpu("cuda.current_device")
synchronize = _no_gpu("cuda.synchronize")
memory_allocated = _no_gpu("cuda.memory_allocated")
memory_reserved = _no_gpu("cuda.memory_reserved")
max_memory_allocated = _no_gpu("cuda.max_memory_allocated")
max_memory_reserved = _no_gpu("cuda.max_memory_reserved")
memory_stats = _no_gpu("cuda.memory_stats")
reset_peak_memory_stats = _no_gpu("cuda.reset_peak_memory_stats")
get_device_properties = _no_gpu("cuda.get_device_properties")
