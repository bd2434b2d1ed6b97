"""A small PyTorch training loop for scripts/gpu-check.sh.

At sync points (the last after a large block left unsplit) it records (CLOCK_MONOTONIC ns, torch.cuda.memory_reserved(),
torch.cuda.memory_allocated()) into the JSON file named by argv[1]; gpu_trace_check.py compares
them with the traced live device bytes (the reserve) and live framework blocks (the tensors), and
finds the lines marked PY_*_LINE below in the Python frames of the allocations made there. It
prints the median time of a training step (`step_ms <median>`), for the slowdown of capture.
"""
import json
import sys
import time

import torch

points = []


def sync_point(label):
    torch.cuda.synchronize()
    points.append({"label": label, "mono_ns": time.monotonic_ns(),
                   "reserved": torch.cuda.memory_reserved(),
                   "allocated": torch.cuda.memory_allocated(),
                   "max_reserved": torch.cuda.max_memory_reserved()})
    torch.cuda.nvtx.mark(f"sync {label}")


def allocate_big():
    return torch.empty(512 << 20, dtype=torch.uint8, device="cuda")  # PY_BIG_ALLOC_LINE


model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()  # PY_MODEL_LINE
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sync_point("init")
step_ns = []
for step in range(20):
    t0 = time.perf_counter_ns()
    torch.cuda.nvtx.range_push(f"step {step}")
    x = torch.randn(256 * (1 + step % 4), 1024, device="cuda")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    step_ns.append(time.perf_counter_ns() - t0)
    if step % 5 == 4:
        sync_point(f"step{step}")
big = allocate_big()  # PY_BIG_CALL_LINE
sync_point("big")
del big
torch.cuda.empty_cache()
sync_point("after_empty_cache")
# A large block left unsplit: on a stream of its own (no cached blocks), 3 MiB takes a new
# 20 MiB segment, and 16.5 MiB of the 17 MiB left gets all 17 (at most 1 MiB would remain), which
# memory_allocated() counts; with expandable segments it is split.
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    first = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    rest = torch.empty(33 << 19, dtype=torch.uint8, device="cuda")
sync_point("unsplit")
json.dump(points, open(sys.argv[1], "w"))
# Steady state: the steps after the first five (allocator warm-up, Adam's state).
print("step_ms %.3f" % (sorted(step_ns[5:])[len(step_ns[5:]) // 2] / 1e6))
