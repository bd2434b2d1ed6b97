"""A training loop on the fake torch for gpucollect's tests (collector/tests/python_hook.rs
finds the lines below by their marker comments).

usage: torch_train.py SCENARIO
  leaks: three leak patterns, one per step, each growing by a known amount per step:
    a list of tensors kept (LEAK_LIST), an unbounded cache keyed by step (LEAK_CACHE), and
    an autograd-like graph kept alive through the loss history (LEAK_GRAPH); temporaries
    freed in between. At each sync point the program writes torch.cuda.memory_allocated() as an
    NVTX mark `sync <bytes>`, after waiting long enough for gpucollect's pulls to catch up.
  bounded: a cache of the last three steps' tensors (the marked line), oldest dropped: bounded,
    not a leak; the batches are freed every step.
  oom: tensors of 512 KiB kept until the fake driver's memory (FAKE_CUDA_MEM_BYTES) runs out
    (the marked line), then the process leaves through os._exit, as a killed one would: no exit
    handler runs, so only what gpucollect read at the out-of-memory is in the trace.
  streams: a tensor a side stream used (record_stream) dies: memory_allocated() drops at once,
    its block returns to the cache only at torch.cuda.synchronize(); sync points before and
    after.
  burst: one tensor, a pull, then a burst of 400 short-lived tensors between two pulls (to wrap a
    small history).
  child: a multiprocessing spawn child keeps one tensor of 48 KiB.
  unsplit: a tensor of 3 MiB gets a new 4 MiB segment whole (at most 1 MiB would remain, so the
    allocator does not split it: memory_allocated() counts 4 MiB), then, freed, gives 1.5 MiB of
    its 4 MiB to a smaller one and keeps the rest free; sync points after each.
A batch is 64 KiB and 4 bytes: the history records that request, memory_allocated() counts its
block (rounded up to 512 bytes), and the trace must count the block.
"""

import os
import sys
import time

import torch

KiB = 1024
settle = 4 * int(os.environ.get("GPUCOLLECT_POOL_INTERVAL_MS", "50")) / 1e3


def sync():
    allocated = torch.cuda.memory_allocated()
    time.sleep(settle)
    torch.cuda.nvtx.mark("sync %d" % allocated)


class Node:
    """A graph node: its output tensor and the node it was computed from."""

    def __init__(self, out, parent):
        self.out = out
        self.parent = parent


kept = []
cache = {}


def load_batch(step):
    return torch.empty(64 * KiB + 4)  # BATCH_LINE


def forward(batch, parent):
    activation = torch.empty(32 * KiB)  # GRAPH_LINE
    return Node(activation, parent)


def train(steps):
    loss = None
    for step in range(steps):
        batch = load_batch(step)
        loss = forward(batch, loss)  # the loss keeps every step's graph alive
        kept.append(torch.empty(16 * KiB))  # LIST_LINE
        cache[step] = torch.empty(8 * KiB)  # CACHE_LINE
        del batch
        sync()
    return loss


def bounded(steps):
    recent = []
    for step in range(steps):
        batch = load_batch(step)
        recent.append(torch.empty(16 * KiB))  # BOUNDED_LINE
        if len(recent) > 3:
            recent.pop(0)
        del batch
        sync()


def oom():
    try:
        while True:
            kept.append(torch.empty(512 * KiB))  # OOM_LINE
    except RuntimeError:
        sys.stdout.flush()
        os._exit(0)


def streams():
    keep = torch.empty(16 * KiB)  # noqa: F841
    t = torch.empty(64 * KiB)  # STREAM_LINE
    t.record_stream(None)
    del t
    sync()
    torch.cuda.synchronize()
    sync()


def burst():
    first = torch.empty(KiB)  # noqa: F841 (read by a pull before the burst)
    sync()
    for _ in range(400):
        torch.empty(KiB)  # BURST_LINE
    sync()


def child():
    kept.append(torch.empty(48 * KiB))  # CHILD_LINE
    sync()


def unsplit():
    big = torch.empty(3 * 1024 * KiB)  # UNSPLIT_LINE
    sync()
    del big
    part = torch.empty(1536 * KiB)  # noqa: F841
    sync()


if __name__ == "__main__":
    if sys.argv[1] == "leaks":
        graph = train(6)
        sync()
    elif sys.argv[1] == "bounded":
        bounded(12)
        sync()
    elif sys.argv[1] == "streams":
        streams()
    elif sys.argv[1] == "oom":
        oom()
    elif sys.argv[1] == "unsplit":
        unsplit()
    elif sys.argv[1] == "child":
        import multiprocessing

        p = multiprocessing.get_context("spawn").Process(target=child)
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
    else:
        burst()
