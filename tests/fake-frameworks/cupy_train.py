"""CuPy pool allocations for gpucollect's tests (collector/tests/python_hook.rs finds the lines
below by their marker comments): arrays kept by the main thread and by a thread started after
cupy's import, one freed; then the pool's used bytes are written as the NVTX mark
`used <bytes>` (through the fake NVTX library, FAKE_NVTX), before the arrays die at exit."""

import ctypes
import os
import threading

import cupy

KiB = 1024
kept = []


def main_work():
    kept.append(cupy.empty(24 * KiB))  # CUPY_MAIN_LINE
    tmp = cupy.empty(40 * KiB)  # CUPY_TMP_LINE
    del tmp


def thread_work():
    kept.append(cupy.empty(12 * KiB))  # CUPY_THREAD_LINE


if __name__ == "__main__":
    for _ in range(3):
        main_work()
    t = threading.Thread(target=thread_work)
    t.start()
    t.join()
    nvtx = ctypes.CDLL(os.environ["FAKE_NVTX"])
    nvtx.nvtxMarkA.argtypes = [ctypes.c_char_p]
    nvtx.nvtxMarkA(b"used %d" % cupy.get_default_memory_pool().used_bytes())
