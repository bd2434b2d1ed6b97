"""Python multiprocessing workers calling the fake CUDA driver through ctypes, for gpucollect's
multi-process tests (collector/tests/fake_cuda.rs). The parent never touches CUDA; each worker
initialises the driver itself and leaks one allocation whose size names its start method:
  1 MiB  spawn       (fork + exec of a new interpreter, like torchrun's workers)
  2 MiB  fork        (a forked copy of the parent)
  3 MiB  forkserver  (forked by a server process that was itself started by fork + exec)

usage: python3 python_workers.py PATH/TO/libcuda.so.1
"""

import ctypes
import multiprocessing
import sys

MiB = 1 << 20


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: CUresult {rc}")


def work(path, size):
    cuda = ctypes.CDLL(path)
    check(cuda.cuInit(0), "cuInit")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc_v2")  # PY_WORKER_LINE


def main(path):
    for size, method in ((1, "spawn"), (2, "fork"), (3, "forkserver")):
        p = multiprocessing.get_context(method).Process(target=work, args=(path, size * MiB))
        p.start()
        p.join()
        if p.exitcode != 0:
            sys.exit(f"{method} worker exited with {p.exitcode}")
    print("python_workers: 3 workers done")


if __name__ == "__main__":
    main(sys.argv[1])
