"""Captures a real PyTorch memory snapshot for gpucollect's import tests (needs a CUDA GPU).

    python3 scripts/torch-snapshot.py OUT_DIR

Writes OUT_DIR/real-torch.pickle (torch.cuda.memory._dump_snapshot after a small training loop
that keeps every loss tensor with its graph: a leak) and OUT_DIR/real-torch.expected.json with
what PyTorch itself reports at the end (allocated, reserved, peak allocated).
"""
import json
import os
import sys

import torch

out = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out, exist_ok=True)
torch.cuda.memory._record_memory_history(max_entries=100000)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
for step in range(30):
    with torch.autograd.profiler.record_function("train_step"):
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss)  # keeps the graph alive: the leak
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot(os.path.join(out, "real-torch.pickle"))
expected = {
    "torch": torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "memory_allocated": torch.cuda.memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "segments_total_size": sum(s["total_size"] for s in snap["segments"]),
    "active_blocks_bytes": sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"].startswith("active")),
    "trace_entries": sum(len(t) for t in snap["device_traces"]),
}
with open(os.path.join(out, "real-torch.expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
print(json.dumps(expected))
