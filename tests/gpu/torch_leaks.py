"""The three training-loop leak patterns on a real GPU, for scripts/gpu-check.sh: a graph kept
alive through a running sum of the losses (the graph's tensors are made on the lines marked
PY_GRAPH; any of them names it), a list of tensors, an unbounded cache, and a bounded cache of
the last three steps, which is no leak (each on the line its marker comment names).
gpu_trace_check.py (scenario torch_leaks) reads `gpucollect report --format json` of its trace:
the three leaks must be its first problems, at these lines, and nothing at the bounded cache.
"""
import torch

MiB = 1 << 20
model = torch.nn.Linear(1024, 1024).cuda()
kept, cache, recent = [], {}, []
loss_sum = None
for step in range(30):
    x = torch.randn(256, 1024, device="cuda")  # PY_GRAPH_X_LINE
    y = model(x)  # PY_GRAPH_Y_LINE
    loss = y.pow(2).mean()  # PY_GRAPH_LOSS_LINE
    loss_sum = loss if loss_sum is None else loss_sum + loss  # PY_GRAPH_LINE
    kept.append(torch.empty(2 * MiB, dtype=torch.uint8, device="cuda"))  # PY_LIST_LINE
    cache[step] = torch.empty(MiB, dtype=torch.uint8, device="cuda")  # PY_CACHE_LINE
    recent.append(torch.empty(4 * MiB, dtype=torch.uint8, device="cuda"))  # PY_BOUNDED_LINE
    if len(recent) > 3:
        recent.pop(0)
    torch.cuda.synchronize()
print("allocated at the end", torch.cuda.memory_allocated())
