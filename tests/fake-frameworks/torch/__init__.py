"""A fake `torch` for gpucollect's tests (no GPU, no real PyTorch): tensors of bytes on a fake
CUDA device, held by a caching allocator (torch/cuda/memory.py) that takes its segments from the
fake libcuda.so.1 (FAKE_LIBCUDA: its path) through ctypes, so the driver layer under it is
real to gpucollect. Only what gpucollect's capture and the tests use is here.

`include/` holds the one C++ header gpucollect's trace tracker shim needs. Where a test has
built torch/lib/libc10_cuda.so (tests/fake-frameworks/fake_c10_cuda.cpp) into a copy of this
package, importing torch loads it, as the real torch loads its libc10_cuda.so, and the caching
allocator reports every action to it (its trace trackers)."""

import ctypes
import os

_lib_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libc10_cuda.so")
_c10_cuda = ctypes.CDLL(_lib_path) if os.path.exists(_lib_path) else None
if _c10_cuda is not None:
    _c10_cuda.fake_c10_cuda_record.restype = None
    _c10_cuda.fake_c10_cuda_record.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_uint64,
    ]
    _c10_cuda.fake_c10_cuda_tracker_nanos.restype = ctypes.c_uint64
    _c10_cuda.fake_c10_cuda_tracker_calls.restype = ctypes.c_uint64
    _c10_cuda.fake_c10_cuda_alloc_nanos.restype = ctypes.c_uint64
    _c10_cuda.fake_c10_cuda_alloc_calls.restype = ctypes.c_uint64

from . import _C, cuda  # noqa: E402, F401

__version__ = "0.0.0+gpucollect.fake"


class Tensor:
    """`nbytes` bytes of device memory, returned to the cache when the tensor dies."""

    def __init__(self, nbytes, block):
        self.nbytes = nbytes
        self._block = block
        self._stream_used = False

    def data_ptr(self):
        return self._block

    def record_stream(self, stream):
        """A side stream uses the memory: when the tensor dies, its block returns to the cache
        only once that stream is done (torch.cuda.synchronize())."""
        self._stream_used = True

    def __del__(self):
        if self._block is not None:
            cuda.memory._free(self._block, self._stream_used)
            self._block = None


def empty(nbytes, device="cuda"):
    """A tensor of `nbytes` bytes (the real torch.empty takes a shape and dtype)."""
    if device != "cuda":
        raise ValueError("the fake torch has CUDA tensors only")
    cuda._lazy_init()
    return Tensor(nbytes, cuda.memory._alloc(nbytes))
