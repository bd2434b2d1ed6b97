"""cupy.cuda of the fake cupy: MemoryHook (per-thread hooks, as in CuPy) and the memory pool."""

import ctypes
import os
import threading

_local = threading.local()


def _hooks():
    if not hasattr(_local, "hooks"):
        _local.hooks = {}
    return _local.hooks


class MemoryHook:
    """Base class of memory hooks; `with hook:` installs it for the current thread."""

    name = "MemoryHook"

    def __enter__(self):
        hooks = _hooks()
        if self.name in hooks:
            raise RuntimeError("memory hook %s already exists" % self.name)
        hooks[self.name] = self
        return self

    def __exit__(self, *exc):
        del _hooks()[self.name]

    def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
        pass

    def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
        pass


class MemoryPool:
    _ROUND = 512
    _CHUNK = 2 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._driver = None
        self._free = []  # [start, end) ranges
        self._live = {}
        self._used = 0

    def _init(self):
        d = ctypes.CDLL(os.environ["FAKE_LIBCUDA"])
        assert d.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        self._driver = d

    def malloc(self, size):
        block = max(self._ROUND, (size + self._ROUND - 1) // self._ROUND * self._ROUND)
        with self._lock:
            if self._driver is None:
                self._init()
            ctx = ctypes.c_void_p()
            self._driver.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
            self._driver.cuCtxSetCurrent(ctx)
            for r in self._free:
                if r[1] - r[0] >= block:
                    break
            else:
                chunk = max(self._CHUNK, block)
                ptr = ctypes.c_uint64()
                assert self._driver.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(chunk)) == 0
                r = [ptr.value, ptr.value + chunk]
                self._free.append(r)
            addr = r[0]
            r[0] += block
            if r[0] == r[1]:
                self._free.remove(r)
            self._live[addr] = block
            self._used += block
        for hook in list(_hooks().values()):
            hook.malloc_postprocess(0, size, block, addr, id(self))
        return addr

    def free(self, addr):
        with self._lock:
            block = self._live.pop(addr)
            self._used -= block
            self._free.append([addr, addr + block])
        for hook in list(_hooks().values()):
            hook.free_postprocess(0, block, addr, id(self))

    def used_bytes(self):
        return self._used


_pool = MemoryPool()
