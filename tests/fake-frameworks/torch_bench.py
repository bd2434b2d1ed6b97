"""Tensor events for scripts/bench-torch-fallback.sh: N tensors made and freed in batches of
1000 (so a 100,000-entry history never wraps between reads), 12 Python frames deep."""

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
