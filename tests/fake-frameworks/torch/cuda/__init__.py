"""torch.cuda of the fake torch: lazy initialisation of the fake driver, NVTX marks."""

import ctypes
import os

from . import memory  # noqa: F401

_initialized = False
_driver = None


def _check(rc, what):
    if rc != 0:
        raise RuntimeError("fake torch: %s failed: CUresult %d" % (what, rc))


def _lazy_init():
    """Initialises CUDA once (cuInit, the primary context), as torch does on first CUDA use."""
    global _initialized, _driver
    if _initialized:
        return
    driver = ctypes.CDLL(os.environ["FAKE_LIBCUDA"])
    _check(driver.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    _check(driver.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _driver = driver
    _initialized = True


def is_initialized():
    return _initialized


def synchronize():
    memory._synchronize()


def memory_allocated():
    return memory.memory_allocated()


class nvtx:
    """torch.cuda.nvtx.mark through the fake NVTX library (FAKE_NVTX: its path)."""

    _lib = None

    @staticmethod
    def mark(msg):
        if nvtx._lib is None:
            nvtx._lib = ctypes.CDLL(os.environ["FAKE_NVTX"])
            nvtx._lib.nvtxMarkA.argtypes = [ctypes.c_char_p]
        nvtx._lib.nvtxMarkA(msg.encode())
