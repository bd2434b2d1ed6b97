"""A fake `cupy` for gpucollect's tests: arrays of bytes from a memory pool that takes 2 MiB
chunks from the fake libcuda.so.1 (FAKE_LIBCUDA) and calls the current thread's memory hooks
as CuPy does (malloc_postprocess with the rounded block size and the pool's id,
free_postprocess when the block returns to the pool)."""

from . import cuda  # noqa: F401

__version__ = "0.0.0+gpucollect.fake"


class ndarray:
    def __init__(self, nbytes):
        self.nbytes = nbytes
        self._ptr = cuda._pool.malloc(nbytes)

    def __del__(self):
        if self._ptr is not None:
            cuda._pool.free(self._ptr)
            self._ptr = None


def empty(nbytes):
    """An array of `nbytes` bytes (the real cupy.empty takes a shape and dtype)."""
    return ndarray(nbytes)


def get_default_memory_pool():
    return cuda._pool
