"""Writes PyTorch-shaped memory snapshots (the dict torch.cuda.memory._snapshot() returns, as
documented in torch/cuda/_memory_viz.py and shared/design/anchors.md) with known final state.

    python3 make_fixtures.py            # writes the fixtures next to this file
    python3 make_fixtures.py N OUT      # a synthetic training snapshot with N trace entries
    python3 make_fixtures.py N OUT real # the same, shaped like real snapshots' frames

Real snapshots (see real-torch.pickle) give every trace entry a list of its own of ~27 frames
(C++ and Python), the frame dicts themselves shared between entries; the synthetic ones share
whole lists. `real` writes lists of their own: 23 C++ frames drawn from a pool of 256 shared
frame dicts, then the entry's 2-4 Python frames.

The simulated caching allocator carves 2 MiB-aligned blocks out of 20 MiB segments. The ring
buffer keeps only the last entries, so some blocks were allocated before the history starts
(they appear only in the final segments) and some frees refer to blocks the history never saw
allocated ("ghost blocks").
"""
import json
import pickle
import random
import sys

MIB = 1 << 20
SEG = 20 * MIB


def frames(*names):
    # Innermost first, as PyTorch records them.
    return [{"filename": f, "line": line, "name": n} for (n, f, line) in names]


STEP = frames(("empty", "torch/_tensor.py", 1), ("forward", "model.py", 33),
              ("train_step", "train.py", 58), ("<module>", "train.py", 131))
LEAK = frames(("record_loss", "train.py", 42), ("train_step", "train.py", 64),
              ("<module>", "train.py", 131))
OLD = frames(("build_model", "model.py", 14), ("<module>", "train.py", 120))


CPP_POOL = [{"filename": "??" if i % 3 else "CUDACachingAllocator.cpp", "line": 0,
             "name": f"c10::native::frame_{i}(at::Tensor const&)"} for i in range(256)]


def make(entries, seed=1, devices=1, ring=None, real=False):
    rnd = random.Random(seed)
    # Real-shaped frames: a new list per entry, of shared frame dicts.
    cpp = random.Random(seed + 1)

    def own(fr):
        if not real or not fr:
            return fr
        start = cpp.randrange(len(CPP_POOL) - 23)
        return CPP_POOL[start:start + 23] + fr
    t = 1_700_000_000_000_000
    traces = [[] for _ in range(devices)]
    segments = {}  # (device, seg_addr) -> {"top", "free": {size: [addr]}, "blocks": {addr: (size, frames)}}
    seg_next = [0x7F0000000000 + d * 0x10000000000 for d in range(devices)]
    live = [dict() for _ in range(devices)]  # addr -> (size, frames)
    order = [[] for _ in range(devices)]  # segment addresses per device, oldest first
    annotations = []

    def new_segment(d):
        a = seg_next[d]
        seg_next[d] += SEG
        segments[(d, a)] = {"top": a, "free": {}, "blocks": {}}
        order[d].append(a)
        traces[d].append({"action": "segment_alloc", "addr": a, "size": SEG, "stream": 0,
                          "time_us": t, "frames": []})
        return a

    def alloc(d, size, fr):
        # Exact-size reuse of a freed block, else carve from a segment's unused tail; only the
        # newest segments are searched (keeps generation linear in the number of entries).
        for sa in reversed(order[d][-4:]):
            seg = segments[(d, sa)]
            if seg["free"].get(size):
                fa = seg["free"][size].pop()
            elif seg["top"] + size <= sa + SEG:
                fa = seg["top"]
                seg["top"] += size
            else:
                continue
            seg["blocks"][fa] = (size, fr)
            live[d][fa] = (size, fr, sa)
            traces[d].append({"action": "alloc", "addr": fa, "size": size, "stream": 0,
                              "time_us": t, "frames": own(fr)})
            return fa
        new_segment(d)
        return alloc(d, size, fr)

    def free(d, addr):
        size, fr, sa = live[d].pop(addr)
        seg = segments[(d, sa)]
        del seg["blocks"][addr]
        seg["free"].setdefault(size, []).append(addr)
        traces[d].append({"action": "free_requested", "addr": addr, "size": size, "stream": 0,
                          "time_us": t, "frames": own(fr)})
        traces[d].append({"action": "free_completed", "addr": addr, "size": size, "stream": 0,
                          "time_us": t + 5, "frames": own(fr)})

    # Warm-up: the model's weights (allocated long before the ring buffer's window).
    for d in range(devices):
        for _ in range(3):
            alloc(d, 4 * MIB, OLD)
    step = 0
    while sum(len(x) for x in traces) < entries:
        step += 1
        t += 1000
        annotations.append({"device": 0, "stage": "START", "name": "train_step", "time_us": t})
        for d in range(devices):
            acts = [alloc(d, rnd.choice([2, 4, 6]) * MIB, STEP) for _ in range(3)]
            t += 200
            for a in acts:
                free(d, a)
            t += 10  # the frees complete (t + 5) before anything reuses their blocks
            if step % 4 == 0:
                alloc(d, 2 * MIB, LEAK)  # kept forever: the leak
        t += 300
        annotations.append({"device": 0, "stage": "END", "name": "train_step", "time_us": t})
    # An out-of-memory report and a snapshot marker at the end.
    traces[0].append({"action": "oom", "addr": 123 * MIB, "size": 900 * MIB, "stream": 0,
                      "time_us": t + 10, "frames": STEP})
    traces[0].append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0,
                      "time_us": t + 20, "frames": []})
    if ring:
        # Keep the last `ring` entries per device, like PyTorch's trace_alloc_max_entries.
        # The window starts at a free, so the history frees blocks it never saw allocated.
        def window(tr):
            start = max(len(tr) - ring, 0)
            while start < len(tr) and tr[start]["action"] != "free_requested":
                start += 1
            return tr[start:]
        traces = [window(tr) for tr in traces]
    segs = []
    for (d, sa), seg in sorted(segments.items()):
        blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
                   "frames": fr} for a, (s, fr) in sorted(seg["blocks"].items())]
        holes = [(fa, fs) for fs, addrs in seg["free"].items() for fa in addrs]
        if seg["top"] < sa + SEG:
            holes.append((seg["top"], sa + SEG - seg["top"]))
        for fa, fs in sorted(holes):
            blocks.append({"address": fa, "size": fs, "requested_size": 0,
                           "state": "inactive", "frames": []})
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segs.append({"device": d, "address": sa, "total_size": SEG, "allocated_size": allocated,
                     "active_size": allocated, "requested_size": allocated, "stream": 0,
                     "segment_type": "large", "segment_pool_id": (0, 0),
                     "is_expandable": False, "frames": [], "blocks": blocks})
    return {
        "segments": segs,
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False},
        "external_annotations": annotations,
    }


def expected(snap):
    """What the snapshot itself says: final allocated and reserved bytes per device (from the
    segments), and the peak of allocated bytes (as memory_allocated() counts: a block is freed
    at its free request) over the history replayed in time order, starting
    from the blocks that were alive before it (final active blocks the history never allocated,
    plus blocks the history frees without allocating)."""
    devices = max(len(snap["device_traces"]), 1 + max((s["device"] for s in snap["segments"]), default=-1))
    live_end = [0] * devices
    reserved_end = [0] * devices
    for s in snap["segments"]:
        reserved_end[s["device"]] += s["total_size"]
        live_end[s["device"]] += sum(b["size"] for b in s["blocks"] if b["state"].startswith("active"))
    events = sorted(((e["time_us"], d, i, e) for d, tr in enumerate(snap["device_traces"])
                     for i, e in enumerate(tr)), key=lambda x: (x[0], x[1] * 10**9 + x[2]))
    seen, start = set(), {}
    for _, d, _, e in events:
        k = (d, e["addr"])
        if e["action"] == "alloc":
            seen.add(k)
        elif e["action"] in ("free_requested", "free_completed") and k not in seen and k not in start:
            start[k] = e["size"]
    alive = {}
    for _, d, _, e in events:
        if e["action"] == "alloc":
            alive[(d, e["addr"])] = True
        elif e["action"] == "free_completed":
            alive.pop((d, e["addr"]), None)
    for s in snap["segments"]:
        for b in s["blocks"]:
            k = (s["device"], b["address"])
            if b["state"].startswith("active") and k not in alive and k not in start:
                start[k] = b["size"]
    live = dict(start)
    total = peak = sum(live.values())
    for _, d, _, e in events:
        k = (d, e["addr"])
        if e["action"] == "alloc":
            total -= live.pop(k, 0)
            live[k] = e["size"]
            total += e["size"]
            peak = max(peak, total)
        elif e["action"] == "free_requested" and k in live:
            # memory_allocated() drops when the free is requested, not when it completes.
            total -= live.pop(k)
    return {"live_at_end_bytes": sum(live_end), "live_at_end_per_device": live_end,
            "reserved_per_device": reserved_end, "peak_bytes": peak,
            "trace_entries": sum(len(t) for t in snap["device_traces"]),
            "failed_allocations": sum(e["action"] == "oom" for t in snap["device_traces"] for e in t)}


def write(name, snap, protocol):
    with open(name + ".pickle", "wb") as f:
        pickle.dump(snap, f, protocol=protocol)
    with open(name + ".expected.json", "w") as f:
        json.dump(expected(snap), f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) in (3, 4):
        real = sys.argv[3:] == ["real"]
        with open(sys.argv[2], "wb") as f:
            pickle.dump(make(int(sys.argv[1]), seed=3, devices=1, real=real), f, protocol=4)
        sys.exit(0)
    full = make(2000, seed=1, devices=2)
    write("two-devices", full, 4)
    with open("two-devices.json", "w") as f:
        json.dump(full, f)
    write("ring-buffer", make(3000, seed=2, devices=1, ring=805), 5)
