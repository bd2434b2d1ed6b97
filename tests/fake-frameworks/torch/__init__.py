"""A fake `torch` for gpucollect's tests (no GPU, no real PyTorch): tensors of bytes on a fake
CUDA device, held by a caching allocator (torch/cuda/memory.py) that takes its segments from the
fake libcuda.so.1 (FAKE_LIBCUDA: its path) through ctypes, so the driver layer under it is
real to gpucollect. Only what gpucollect's capture and the tests use is here."""

from . import _C, cuda  # noqa: F401

__version__ = "0.0.0+gpucollect.fake"


class Tensor:
    """`nbytes` bytes of device memory, returned to the cache when the tensor dies."""

    def __init__(self, nbytes, block):
        self.nbytes = nbytes
        self._block = block

    def data_ptr(self):
        return self._block

    def __del__(self):
        if self._block is not None:
            cuda.memory._free(self._block)
            self._block = None


def empty(nbytes, device="cuda"):
    """A tensor of `nbytes` bytes (the real torch.empty takes a shape and dtype)."""
    if device != "cuda":
        raise ValueError("the fake torch has CUDA tensors only")
    cuda._lazy_init()
    return Tensor(nbytes, cuda.memory._alloc(nbytes))
