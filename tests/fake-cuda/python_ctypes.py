"""A Python program calling the fake CUDA driver through ctypes, for gpucollect's Python-frame
tests (collector/tests/fake_cuda.rs finds the lines below by their marker comments).

usage: python3 python_ctypes.py PATH/TO/libcuda.so.1

Every allocation goes through alloc(); sizes tell them apart:
  3 MiB  leaked by train_step through ctypes.CDLL (the GIL is released during the call)
  1 MiB  freed by train_step through ctypes.CDLL
  5 MiB  leaked by train_step through ctypes.PyDLL (the GIL is held during the call)
  2 MiB  freed by train_step through ctypes.PyDLL
  7 MiB  leaked by a Python thread that then exits
  11 MiB leaked from a generator (its frame runs in its own C-level evaluation-loop call)
  13 MiB leaked from a lambda called by the C function map() (another evaluation-loop call)
  17 MiB leaked by a forked child process (which describes the code objects again)
"""

import ctypes
import os
import sys
import threading

MiB = 1 << 20


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: CUresult {rc}")


def use_device(cuda):
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def alloc(cuda, size):
    ptr = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))  # PY_ALLOC_LINE
    check(rc, "cuMemAlloc_v2")
    return ptr


def load_batch(cuda, size):
    return alloc(cuda, size)  # PY_LOAD_BATCH_LINE


def train_step(cuda, leaked, freed):
    kept = load_batch(cuda, leaked)  # PY_LEAK_LINE
    tmp = load_batch(cuda, freed)  # PY_FREED_LINE
    check(cuda.cuMemFree_v2(tmp), "cuMemFree_v2")
    return kept


def worker(cuda, out):
    use_device(cuda)
    out.append(load_batch(cuda, 7 * MiB))  # PY_THREAD_LINE


def batches(cuda):
    yield load_batch(cuda, 11 * MiB)  # PY_GENERATOR_LINE


def forked_child(cuda):
    load_batch(cuda, 17 * MiB)  # PY_FORK_LINE
    os._exit(0)


def main(path):
    cdll = ctypes.CDLL(path)
    pydll = ctypes.PyDLL(path)
    check(cdll.cuInit(0), "cuInit")
    use_device(cdll)
    kept = [train_step(cdll, 3 * MiB, 1 * MiB)]  # PY_MAIN_CDLL_LINE
    kept.append(train_step(pydll, 5 * MiB, 2 * MiB))  # PY_MAIN_PYDLL_LINE
    t = threading.Thread(target=worker, args=(cdll, kept), name="py-worker")
    t.start()
    t.join()
    kept += list(batches(cdll))  # PY_MAIN_GENERATOR_LINE
    kept += list(map(lambda n: load_batch(cdll, n), [13 * MiB]))  # PY_MAP_LINE
    pid = os.fork()
    if pid == 0:
        forked_child(cdll)
    os.waitpid(pid, 0)
    print(f"python_ctypes: {len(kept)} allocations kept")


if __name__ == "__main__":
    main(sys.argv[1])  # PY_MODULE_LINE
