#!/usr/bin/env python3
"""Checks gpucollect traces taken on a real GPU (used by scripts/gpu-check.sh).

Self-contained (no msgpack module needed): a minimal msgpack reader plus a replay of the
format-v1 records that matter here (see analysis-core/src/encode.rs for the layout).
Usage: gpu_trace_check.py TRACE SCENARIO [SIDE_FILE]; prints PASS/FAIL lines, exits 1 on FAIL.
"""
import json
import os
import struct
import sys


def unpack(buf, i):
    b = buf[i]
    i += 1
    if b <= 0x7F:
        return b, i
    if b >= 0xE0:
        return b - 0x100, i
    if 0x80 <= b <= 0x8F:
        return read_map(buf, i, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return read_array(buf, i, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return buf[i:i + n].decode("utf-8", "replace"), i + n
    if b == 0xC0:
        return None, i
    if b in (0xC2, 0xC3):
        return b == 0xC3, i
    fixed = {0xCC: "B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: "b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if b in fixed:
        f = fixed[b]
        n = struct.calcsize(f)
        return struct.unpack_from(f, buf, i)[0], i + n
    lens = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}
    if b in lens:
        f = lens[b]
        n = struct.unpack_from(f, buf, i)[0]
        i += struct.calcsize(f)
        raw = bytes(buf[i:i + n])
        return (raw if b in (0xC4, 0xC5, 0xC6) else raw.decode("utf-8", "replace")), i + n
    if b in (0xDC, 0xDD):
        f = ">H" if b == 0xDC else ">I"
        n = struct.unpack_from(f, buf, i)[0]
        return read_array(buf, i + struct.calcsize(f), n)
    if b in (0xDE, 0xDF):
        f = ">H" if b == 0xDE else ">I"
        n = struct.unpack_from(f, buf, i)[0]
        return read_map(buf, i + struct.calcsize(f), n)
    raise ValueError(f"unsupported msgpack byte {b:#x} at {i - 1}")


def read_array(buf, i, n):
    out = []
    for _ in range(n):
        v, i = unpack(buf, i)
        out.append(v)
    return out, i


def read_map(buf, i, n):
    out = {}
    for _ in range(n):
        k, i = unpack(buf, i)
        v, i = unpack(buf, i)
        out[k] = v
    return out, i


def f(rec, k):
    return rec[k] if k < len(rec) and rec[k] is not None else 0


class Trace:
    def __init__(self, path):
        buf = open(path, "rb").read()
        header, i = unpack(buf, 0)
        assert header[0] == "gpucollect-trace", "not a gpucollect trace"
        self.start_mono = header[3]["start_mono_nanos"]
        self.strings, self.frames, self.symbols, self.stacks, self.modules = {}, {}, {}, {}, {}
        self.allocs, self.failed, self.resets, self.samples, self.marks = [], [], [], [], []
        self.exits, self.threads, self.processes, self.devices = [], {}, [], []
        self.dropped, self.end = 0, False
        self.pools = []
        self.free_unknown = 0
        ts, addr = 0, 0
        while i < len(buf):
            try:
                rec, i = unpack(buf, i)
            except (IndexError, struct.error):
                break  # truncated tail
            tag = rec[0]
            if tag >= 16:
                ts += f(rec, 1)
            if tag == 1:
                self.processes.append({"idx": rec[1], "pid": rec[2], "parent": rec[3], "exe": rec[4]})
            elif tag == 2:
                self.devices.append({"idx": rec[1], "uuid": rec[2], "name": rec[3], "total": rec[4]})
            elif tag == 3:
                self.modules[rec[1]] = rec[3]
            elif tag == 4:
                self.strings[rec[1]] = rec[2]
            elif tag == 5:
                self.frames[rec[1]] = rec
            elif tag == 6:
                self.stacks[rec[1]] = (rec[2], rec[3])
            elif tag == 7:
                self.threads[(f(rec, 2), f(rec, 1))] = self.strings.get(f(rec, 4), "")
            elif tag == 8:
                self.symbols[rec[1]] = (self.strings.get(f(rec, 2), ""), self.strings.get(f(rec, 3), ""), f(rec, 4))
            elif tag == 16:
                addr = (addr + f(rec, 3)) % (1 << 64)
                self.allocs.append({"ts": ts, "size": f(rec, 2), "addr": addr, "stack": f(rec, 4),
                                    "thread": f(rec, 5), "device": f(rec, 6), "kind": f(rec, 7),
                                    "process": f(rec, 10), "free_ts": None, "free_kind": None})
            elif tag == 17:
                a = self.allocs[len(self.allocs) - f(rec, 2)]
                a["free_ts"], a["free_kind"] = ts, f(rec, 4)
            elif tag == 18:
                self.failed.append({"ts": ts, "size": f(rec, 2), "code": f(rec, 3), "stack": f(rec, 4)})
            elif tag == 21:
                self.marks.append((ts, self.strings.get(f(rec, 2), "")))
            elif tag == 22:
                self.samples.append({"ts": ts, "device": f(rec, 2), "total": f(rec, 3), "free": f(rec, 4),
                                     "used": f(rec, 5), "processes": rec[6] if len(rec) > 6 else []})
            elif tag == 23:
                self.pools.append({"ts": ts, "device": f(rec, 2), "pool": f(rec, 3), "reserved": f(rec, 4),
                                   "used": f(rec, 5)})
            elif tag == 24:
                self.exits.append({"process": f(rec, 2), "code": rec[3], "signal": rec[4]})
            elif tag == 25:
                self.dropped += f(rec, 3)
            elif tag == 26:
                self.end = True
            elif tag == 27:
                proc, dev = f(rec, 2), f(rec, 3)
                self.resets.append(ts)
                for a in self.allocs:
                    if a["free_ts"] is None and a["process"] == proc and a["device"] == dev:
                        a["free_ts"], a["free_kind"] = ts, 2
            elif tag == 28:
                self.free_unknown += 1
        self.last_ts = ts

    def frame(self, frame):
        """(function, file, line) of a frame: a Python frame's own, a native frame's symbol."""
        rec = self.frames.get(frame)
        if rec and len(rec) > 5 and rec[2] == 1:
            return (self.strings.get(rec[3], ""), self.strings.get(rec[4], ""), rec[5])
        return self.symbols.get(frame, ("??", "", 0))

    def frames_of(self, stack):
        out = []
        while stack and len(out) < 128:
            parent, frame = self.stacks[stack]
            out.append(self.frame(frame))
            stack = parent
        return out

    def python_frames_of(self, stack):
        """(function, file, line) of the Python frames of a stack, innermost first."""
        out = []
        while stack and len(out) < 128:
            parent, frame = self.stacks[stack]
            rec = self.frames.get(frame)
            if rec and len(rec) > 2 and rec[2] == 1:
                out.append(self.frame(frame))
            stack = parent
        return out

    def modules_of(self, stack):
        out = []
        while stack and len(out) < 128:
            parent, frame = self.stacks[stack]
            rec = self.frames.get(frame)
            if rec and len(rec) > 3 and rec[2] == 0:
                out.append(self.modules.get(rec[3], ""))
            stack = parent
        return out

    def from_caching_allocator(self, a):
        """Whether PyTorch's caching allocator made this allocation (its segments are what
        memory_reserved() counts); anything else is a library's own cudaMalloc."""
        fns = [f[0] for f in self.frames_of(a["stack"])]
        mods = self.modules_of(a["stack"])
        return any("CUDACachingAllocator" in f or "c10::cuda" in f for f in fns) or any(
            "libc10_cuda" in m for m in mods)

    def live(self, device_only=True):
        return [a for a in self.allocs if a["free_ts"] is None and (not device_only or a["kind"] not in (2, 6))]

    def live_bytes_at(self, ts):
        return sum(a["size"] for a in self.allocs if a["kind"] not in (2, 6) and a["ts"] <= ts
                   and (a["free_ts"] is None or a["free_ts"] > ts))


FAILS = []


def marker_line(path, marker):
    """1-based line of `path` holding `marker`."""
    for n, line in enumerate(open(path), 1):
        if marker in line:
            return n
    raise ValueError(f"{marker} not in {path}")


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        FAILS.append(name)


def check_torch_python_frames(t, points, torch_allocs):
    """The caching allocator's cudaMalloc calls carry the Python frames that made them: the
    segment allocate_big() needs has torch_loop.py's line in its stack, under its caller; the
    model's parameters have the line that moved them to the GPU."""
    loop = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu", "torch_loop.py")
    big_line = marker_line(loop, "PY_BIG_ALLOC_LINE")
    call_line = marker_line(loop, "PY_BIG_CALL_LINE")
    model_line = marker_line(loop, "PY_MODEL_LINE")
    at = {p["label"]: p["mono_ns"] - t.start_mono for p in points}

    def has(py, function, line):
        return any(fn == function and file.endswith("torch_loop.py") and ln == line for fn, file, ln in py)

    big = [a for a in torch_allocs if at["step19"] < a["ts"] <= at["big"]]
    stacks = [t.python_frames_of(a["stack"]) for a in big]
    check("torch: allocate_big()'s caching-allocator allocations have its Python line",
          bool(big) and all(has(py, "allocate_big", big_line) and has(py, "<module>", call_line) for py in stacks),
          f"{len(big)} allocation(s) of {sum(a['size'] for a in big)} B; want allocate_big at "
          f"torch_loop.py:{big_line} under <module> at :{call_line}; first Python stack "
          f"{stacks[0][:4] if stacks else None}")
    init = [t.python_frames_of(a["stack"]) for a in torch_allocs if a["ts"] <= at["init"]]
    check("torch: the model's parameters were allocated at its Python line",
          any(has(py, "<module>", model_line) for py in init),
          f"{len(init)} allocation(s) before the first sync point; want <module> at "
          f"torch_loop.py:{model_line}; first Python stack {init[0][:6] if init else None}")
    sites, without = {}, 0
    for a in torch_allocs:
        py = t.python_frames_of(a["stack"])
        if not py:
            without += 1  # e.g. the autograd engine's own thread during backward()
            continue
        fn, file, line = next((f for f in py if f[1].endswith("torch_loop.py")), py[0])
        key = f"{fn} ({os.path.basename(file)}:{line})"
        sites[key] = sites.get(key, 0) + a["size"]
    print(f"INFO caching-allocator allocations by Python call site (first torch_loop.py frame): "
          f"{sorted(sites.items(), key=lambda x: -x[1])[:8]}; {without} without Python frames")


def main():
    path, scenario = sys.argv[1], sys.argv[2]
    t = Trace(path)
    check("clean end", t.end or scenario == "sigkill", f"end record {t.end}, dropped {t.dropped}")
    check("nothing dropped", t.dropped == 0, f"{t.dropped} dropped")
    n_dev = len(t.devices)
    if scenario == "leak_exception":
        live = t.live()
        fr = t.frames_of(live[0]["stack"]) if live else []
        check("one leak of 3 MiB", len(live) == 1 and live[0]["size"] == 3 << 20,
              f"{len(live)} live: {[a['size'] for a in live]}")
        check("leak site is load_batch", bool(fr) and "load_batch" in fr[0][0], f"site {fr[:2]}")
    elif scenario == "async_free":
        check("no leak", not t.live(), f"{len(t.allocs)} allocs, {len(t.live())} live")
    elif scenario == "wrapper":
        live = t.live()
        fr = t.frames_of(t.allocs[0]["stack"]) if t.allocs else []
        check("no leak", len(t.allocs) == 3 and not live, f"{len(t.allocs)} allocs, {len(live)} live")
        check("attributed to the wrapper's caller", bool(fr) and "train_step" in fr[0][0], f"site {fr[:2]}")
    elif scenario == "threads":
        live = t.live()
        threads = {a["thread"] for a in live}
        names = sorted(t.threads.get((a["process"], a["thread"]), "") for a in live)
        check("a leak per thread", len(live) == 4 and len(threads) == 4, f"sizes {[a['size'] for a in live]} names {names}")
    elif scenario == "reset":
        torn = [a for a in t.allocs if a["free_kind"] == 2]
        check("teardown frees, no leak", len(torn) == 2 and not t.live() and t.resets,
              f"{len(t.allocs)} allocs, {len(torn)} torn down, {len(t.resets)} resets, {len(t.live())} live")
    elif scenario == "stream_ordered":
        so = [a for a in t.allocs if a["kind"] == 3]
        check("stream-ordered allocs freed stream-ordered", len(so) == 2 and all(a["free_kind"] == 1 for a in so),
              f"{[(a['size'], a['free_kind']) for a in t.allocs]}")
    elif scenario == "vmm":
        v = [a for a in t.allocs if a["kind"] == 4]
        check("VMM: released+unmapped freed, mapped one live", len(v) == 2 and v[0]["free_ts"] is not None
              and v[1]["free_ts"] is None, f"{[(a['size'], a['free_ts'] is not None) for a in v]}")
    elif scenario == "oom":
        check("failed allocation recorded", len(t.failed) == 1 and t.failed[0]["code"] == 2,
              f"{t.failed}")
    elif scenario == "sigkill":
        check("allocation before SIGKILL is in the trace", any(a["size"] == 12345 for a in t.allocs),
              f"{[a['size'] for a in t.allocs]}; exits {t.exits}")
        check("exit is signal 9", bool(t.exits) and t.exits[0]["signal"] == 9, f"{t.exits}")
    elif scenario == "kinds":
        kinds = sorted({a["kind"] for a in t.allocs})
        check("device, managed, pinned host and array kinds, all freed", {0, 1, 2, 5} <= set(kinds) and not t.live(False),
              f"kinds {kinds}, sizes {[(a['kind'], a['size']) for a in t.allocs]}, live {len(t.live(False))}")
    elif scenario == "cupy":
        point = json.load(open(sys.argv[3]))
        ts = point["mono_ns"] - t.start_mono
        blocks = [a for a in t.allocs if a["kind"] == 7]
        live = sum(a["size"] for a in blocks if a["ts"] <= ts and (a["free_ts"] is None or a["free_ts"] > ts))
        check("cupy: pool blocks live == used_bytes()", live == point["used"],
              f"traced {live} used {point['used']} (pool total {point['total']}, {len(blocks)} blocks)")
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu", "cupy_pool.py")
        line = marker_line(src, "PY_CUPY_LINE")
        threads = {a["thread"] for a in blocks
                   if any(file.endswith("cupy_pool.py") and ln == line for _, file, ln in t.python_frames_of(a["stack"]))}
        check("cupy: kept arrays carry their line, from both threads", len(threads) == 2, f"threads {threads}")
    elif scenario == "torch_leaks":
        # argv[3]: `gpucollect report --format json` of the trace.
        report = json.load(open(sys.argv[3]))
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu", "torch_leaks.py")
        problems = [f for f in report["findings"] if f["severity"] in ("warning", "critical")]
        print(f"INFO problems: {[(f['kind'], f['site'], f['bytes']) for f in problems][:6]}")
        blocks = [a for a in t.allocs if a["kind"] == 7]
        check("torch_leaks: tensors were captured", bool(blocks), f"{len(blocks)} framework blocks")
        graph = ("PY_GRAPH_X_LINE", "PY_GRAPH_Y_LINE", "PY_GRAPH_LOSS_LINE", "PY_GRAPH_LINE")
        expected = []
        for name, markers in (("graph", graph), ("list", ("PY_LIST_LINE",)), ("cache", ("PY_CACHE_LINE",))):
            want = [f"torch_leaks.py:{marker_line(src, m)})" for m in markers]
            expected += want
            at = [j for j, f in enumerate(problems) if any(w in f["site"] for w in want)]
            check(f"torch_leaks: the {name} leak ({' or '.join(w[:-1] for w in want)}) is a problem",
                  bool(at), f"at {at}")
        # The graph's tensors are made on several lines: each may be a finding of its own, but
        # every problem must be one of the three leaks (no false alarm before or between them).
        stray = [f["site"] for f in problems if not any(w in f["site"] for w in expected)]
        check("torch_leaks: every problem is one of the three leaks", not stray, f"others: {stray[:3]}")
        bounded = f"torch_leaks.py:{marker_line(src, 'PY_BOUNDED_LINE')}"
        check("torch_leaks: no problem at the bounded cache", not any(bounded + ")" in f["site"] for f in problems),
              f"{bounded}")
    elif scenario == "pools":
        mib = 1 << 20
        default = [p for p in t.pools if p["pool"] == 0]
        own = [p for p in t.pools if p["pool"] not in (0, (1 << 64) - 1)]
        graph = [p for p in t.pools if p["pool"] == (1 << 64) - 1]
        print(f"INFO pool samples (MiB reserved/used): default {[(p['reserved'] // mib, p['used'] // mib) for p in default][:12]}"
              f" own {[(p['reserved'] // mib, p['used'] // mib) for p in own][:8]}"
              f" graph {[(p['reserved'] // mib, p['used'] // mib) for p in graph][:8]}")
        full = next((i for i, p in enumerate(default) if p["used"] >= 64 * mib), None)
        kept = next((i for i, p in enumerate(default) if full is not None and i > full and p["used"] == 0
                     and p["reserved"] >= 64 * mib), None)
        trimmed = next((i for i, p in enumerate(default) if kept is not None and i > kept
                        and p["reserved"] < 64 * mib), None)
        check("default pool: used 64 MiB, then kept after the free, then trimmed",
              None not in (full, kept, trimmed), f"indices {full}, {kept}, {trimmed}")
        check("own pool: used 32 MiB", any(p["used"] >= 32 * mib for p in own), f"{len(own)} samples")
        check("graph memory: used 16 MiB", any(p["used"] >= 16 * mib for p in graph), f"{len(graph)} samples")
    elif scenario == "multiproc":
        import glob
        workers = [json.load(open(w)) for w in sorted(glob.glob(os.path.join(sys.argv[3], "worker-*.json")))]
        check("two workers reported", len(workers) == 2, f"{[w['pid'] for w in workers]}")
        by_pid = {p["pid"]: p for p in t.processes}
        by_idx = {p["idx"]: p for p in t.processes}
        root = t.processes[0]["idx"] if t.processes else None
        exits = {e["process"]: e for e in t.exits}
        print(f"INFO processes: {[(p['pid'], p['parent'], p['exe']) for p in t.processes]}")
        for w in workers:
            p = by_pid.get(w["pid"])
            check(f"worker {w['rank']} (pid {w['pid']}) is a traced process", p is not None,
                  f"traced pids {sorted(by_pid)}")
            if p is None:
                continue
            chain, q = [], p
            while q is not None and q["parent"] is not None and len(chain) < 16:
                chain.append(q["parent"])
                q = by_idx.get(q["parent"])
            check(f"worker {w['rank']} descends from the program", root in chain,
                  f"ancestors {chain}, root {root}")
            mine = [a for a in t.allocs if a["process"] == p["idx"] and a["kind"] in (0, 1, 3, 4, 5)]
            cached = [a for a in mine if t.from_caching_allocator(a)]
            live = sum(a["size"] for a in cached if a["free_ts"] is None)
            check(f"worker {w['rank']}: caching-allocator live at exit == memory_reserved", live == w["reserved"],
                  f"traced {live} reserved {w['reserved']} (max {w['max_reserved']}); "
                  f"{len(mine)} allocations, {len(cached)} by the caching allocator")
            e = exits.get(p["idx"])
            check(f"worker {w['rank']} has an exit record", e is not None, f"{e}")
    elif scenario == "torch":
        points = json.load(open(sys.argv[3]))
        # Driver allocations (kinds 0-5 but pinned and IPC): the reserve. Kind 7 are the
        # framework's blocks (tensors) inside it.
        dev = [a for a in t.allocs if a["kind"] in (0, 1, 3, 4, 5)]
        blocks = [a for a in t.allocs if a["kind"] == 7]
        torch_allocs = [a for a in dev if t.from_caching_allocator(a)]
        others = [a for a in dev if not t.from_caching_allocator(a)]

        def live_at(allocs, ts):
            return sum(a["size"] for a in allocs if a["ts"] <= ts and (a["free_ts"] is None or a["free_ts"] > ts))

        for p in points:
            ts = p["mono_ns"] - t.start_mono
            traced = live_at(torch_allocs, ts)
            check(f"torch {p['label']}: caching-allocator live == memory_reserved", traced == p["reserved"],
                  f"traced {traced} reserved {p['reserved']}; other libraries' live {live_at(others, ts)}")
            if "allocated" in p and os.environ.get("GPUCOLLECT_CHECK_TENSORS", "1") == "1":
                tensors = live_at(blocks, ts)
                check(f"torch {p['label']}: tensors live == memory_allocated", tensors == p["allocated"],
                      f"traced {tensors} allocated {p['allocated']} ({len(blocks)} blocks in the trace)")
        sites = {}
        for a in others:
            fr = t.frames_of(a["stack"])
            key = fr[0][0] if fr else "??"
            sites[key] = sites.get(key, 0) + a["size"]
        print(f"INFO allocations outside the caching allocator: {len(others)}, by innermost frame: "
              f"{sorted(sites.items(), key=lambda x: -x[1])[:5]}")
        peak = 0
        cur = 0
        ev = sorted([(a["ts"], a["size"]) for a in torch_allocs]
                    + [(a["free_ts"], -a["size"]) for a in torch_allocs if a["free_ts"] is not None])
        for _, d in ev:
            cur += d
            peak = max(peak, cur)
        check("torch caching-allocator peak == max_memory_reserved", peak == points[-1]["max_reserved"],
              f"traced peak {peak} max_reserved {points[-1]['max_reserved']}")
        check_torch_python_frames(t, points, torch_allocs)
        marks = [m for m in t.marks if m[1].startswith("sync ")]
        check("NVTX marks captured", len(marks) == len(points), f"{len(marks)} marks for {len(points)} sync points")
        pid = t.processes[0]["pid"] if t.processes else 0
        nv = [(s["ts"], dict((p[0], p[1]) for p in s["processes"]).get(pid)) for s in t.samples]
        nv = [x for x in nv if x[1]]
        if nv:
            ts, used = max(nv, key=lambda x: x[1])
            check("NVML per-process used >= traced live", used >= t.live_bytes_at(ts),
                  f"NVML {used} traced {t.live_bytes_at(ts)} (difference = context, modules, non-traced)")
    if scenario not in ("torch", "multiproc") and n_dev:
        check("NVML devices described", all(d["total"] > 0 for d in t.devices),
              f"{[(d['name'], d['total']) for d in t.devices]}, {len(t.samples)} samples")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
