"""Tensor events for scripts/bench-torch-fallback.sh and scripts/bench-torch-tracker.sh: N
tensors made and freed in batches of 1000 (so a 100,000-entry history never wraps between
reads), 12 Python frames deep. Where the fake torch has its libc10_cuda.so (the tracker
benchmark), it prints at the end what its trace trackers cost:
`tracker: C calls, T ns, A alloc calls, N ns` (CLOCK_MONOTONIC around the trackers of each
allocator action, in the allocating thread; then the same for the alloc actions alone)."""

import sys

import torch


def depth(n, f):
    return depth(n - 1, f) if n else f()


def batch():
    kept = [torch.empty(4096) for _ in range(1000)]
    del kept


def main(n):
    for _ in range(n // 1000):
        depth(10, batch)


if __name__ == "__main__":
    main(int(sys.argv[1]))
    if torch._c10_cuda is not None:
        lib = torch._c10_cuda
        sys.stderr.write(
            "tracker: %d calls, %d ns, %d alloc calls, %d ns\n"
            % (
                lib.fake_c10_cuda_tracker_calls(),
                lib.fake_c10_cuda_tracker_nanos(),
                lib.fake_c10_cuda_alloc_calls(),
                lib.fake_c10_cuda_alloc_nanos(),
            )
        )
