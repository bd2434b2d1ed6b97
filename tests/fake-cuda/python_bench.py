"""Python variant of `scenarios bench` for scripts/bench-overhead.sh: N cuMemAlloc_v2 +
cuMemFree_v2 pairs through ctypes.CDLL, called DEPTH Python frames deep, on the fake driver.

usage: python3 python_bench.py PATH/TO/libcuda.so.1 N DEPTH
Prints the same `pairs= ns_per_pair= events_per_sec=` line as the C benchmark.
"""

import ctypes
import sys
import time


def bench_loop(cuda, n):
    ptr = ctypes.c_uint64()
    ref = ctypes.byref(ptr)
    size = ctypes.c_size_t(256)
    alloc, free = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2
    t0 = time.perf_counter_ns()
    for _ in range(n):
        alloc(ref, size)
        free(ptr)
    ns = time.perf_counter_ns() - t0
    print(f"pairs={n} ns_per_pair={ns / n:.1f} events_per_sec={2 * n / (ns / 1e9):.0f}")


def bench_at(depth, cuda, n):
    if depth > 0:
        return bench_at(depth - 1, cuda, n)
    return bench_loop(cuda, n)


def main(path, n, depth):
    cuda = ctypes.CDLL(path)
    ctx = ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    bench_at(depth, cuda, n)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
