"""The cost of one tensor allocation and free on a real GPU, for scripts/gpu-check.sh: N
tensors of 4 KiB made and dropped in a loop after a warm-up (the caching allocator serves them
from its cache: no driver call), at a Python depth of about 10 frames. Prints
`tensor_pair_ns <median of 5 rounds>`; run bare and under gpucollect to see what tensor capture
costs per allocation+free.
"""
import sys
import time

import torch

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000


def nest(depth, fn):
    return fn() if depth == 0 else nest(depth - 1, fn)


def loop():
    for _ in range(N):
        t = torch.empty(4096, dtype=torch.uint8, device="cuda")
        del t


torch.empty(4096, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
rounds = []
for _ in range(5):
    t0 = time.perf_counter_ns()
    nest(8, loop)
    rounds.append((time.perf_counter_ns() - t0) / N)
print("tensor_pair_ns %.0f" % sorted(rounds)[2])
