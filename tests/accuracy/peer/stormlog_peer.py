#!/usr/bin/env python3
"""Runs stormlog's analyzer on the accuracy corpus's peer export and judges it like our harness.

Input: a folder of `<scenario>.json` files written by
`cargo run -p gpucollect-accuracy --release -- export-peer DIR` (schema in
tests/accuracy/README.md). Each scenario's `calls` become stormlog `ProfileResult`s (what its
`profile_function` decorator records per call) and its `device_samples` become stormlog
telemetry events (what its `MemoryTracker` exports); then
`MemoryAnalyzer().generate_optimization_report(results, events)` runs with stormlog's defaults.

Judging follows tests/accuracy/src/score.rs: problems are stormlog's warning/critical items in
its own priority order; a healthy scenario passes with none; a faulty one passes when the first
has the planted class and, where it names a function, a call of that function sits at one of the
truth's `file:line` locations. See README.md next to this file for the details.

stormlog is not a project dependency: install it as README.md says. `torch` is replaced by the
stub in `stub_torch/` (put first on sys.path here), so no GPU or PyTorch is needed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLES = os.path.join(HERE, "samples")

# stormlog's names -> the harness's classes (tests/accuracy/src/score.rs). Anything else
# (inefficient_allocation, execution-time insights) is a problem with no class: a false alarm.
PATTERN_CLASS = {
    "memory_leak": "leak",
    "memory_spikes": "spike",
    "fragmentation": "fragmentation",
}
INSIGHT_CLASS = {"temporal": "leak"}  # "Memory Growth Trend"
GAP_CLASS = {
    "transient_spike": "hidden",
    "persistent_drift": "hidden",
    "fragmentation_like": "fragmentation",
}
# A high-impact insight ranks with critical patterns (stormlog's recommendations order).
SEVERITY_RANK = {"critical": 0, "high": 0, "warning": 1}


class InputError(Exception):
    """A scenario file that does not follow the export schema."""


def load_stormlog():
    """Imports stormlog with the torch stub first on sys.path; says how to install it if absent."""
    stub = os.path.join(HERE, "stub_torch")
    if stub not in sys.path:
        sys.path.insert(0, stub)
    try:
        import stormlog
        from stormlog.analyzer import MemoryAnalyzer
        from stormlog.profiler import MemorySnapshot, ProfileResult, _allocated_and_freed
        from stormlog.telemetry import telemetry_event_from_record
    except ImportError as e:
        sys.exit(
            f"cannot import stormlog ({e}); install it as tests/accuracy/peer/README.md says: "
            "python3 -m venv /tmp/stormvenv && /tmp/stormvenv/bin/pip install stormlog==0.4.3, "
            "then run this script with /tmp/stormvenv/bin/python"
        )
    import torch

    if not torch.__version__.endswith("+stormlog-peer-stub"):
        sys.exit(
            f"a real torch ({torch.__file__}) was imported instead of the stub in {stub}; "
            "run this script from a Python environment without torch"
        )
    return {
        "version": getattr(stormlog, "__version__", "unknown"),
        "MemoryAnalyzer": MemoryAnalyzer,
        "MemorySnapshot": MemorySnapshot,
        "ProfileResult": ProfileResult,
        "allocated_and_freed": _allocated_and_freed,
        "event_from_record": telemetry_event_from_record,
    }


# ---------------------------------------------------------------- input


def _int(obj: dict, key: str, where: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(f"{where}: field '{key}' must be a non-negative integer, got {v!r}")
    return v


def _num(obj: dict, key: str, where: str) -> float:
    v = obj.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise InputError(f"{where}: field '{key}' must be a number, got {v!r}")
    return float(v)


def _str(obj: dict, key: str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str):
        raise InputError(f"{where}: field '{key}' must be a string, got {v!r}")
    return v


@dataclass
class Truth:
    healthy: bool
    cls: str | None = None
    locations: list[str] = field(default_factory=list)


def read_truth(t: Any, where: str) -> Truth:
    if not isinstance(t, dict):
        raise InputError(f"{where}: 'truth' must be an object, got {t!r}")
    if t.get("healthy") is True or t.get("verdict") == "healthy":
        return Truth(healthy=True)
    cls = t.get("class")
    if not isinstance(cls, str):
        raise InputError(f"{where}: a faulty truth needs a 'class' string, got {t!r}")
    locs = t.get("locations") or []
    if not isinstance(locs, list) or not all(isinstance(x, str) for x in locs):
        raise InputError(f"{where}: truth 'locations' must be a list of strings")
    return Truth(healthy=False, cls=cls, locations=locs)


def read_scenario(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read the scenario ({e})") from e
    if not isinstance(doc, dict):
        raise InputError(f"{path}: the document must be a JSON object")
    name = doc.get("scenario") or os.path.splitext(os.path.basename(path))[0]
    calls, samples = doc.get("calls", []), doc.get("device_samples", [])
    if not isinstance(calls, list) or not isinstance(samples, list):
        raise InputError(f"{path}: 'calls' and 'device_samples' must be lists")
    out_calls = []
    for i, c in enumerate(calls):
        w = f"{path}: calls[{i}]"
        if not isinstance(c, dict):
            raise InputError(f"{w}: must be an object")
        out_calls.append(
            {
                "function": _str(c, "function", w),
                "file": _str(c, "file", w),
                "line": _int(c, "line", w),
                "start_s": _num(c, "start_s", w),
                "end_s": _num(c, "end_s", w),
                "allocated_before": _int(c, "allocated_before", w),
                "allocated_after": _int(c, "allocated_after", w),
                "reserved_before": _int(c, "reserved_before", w),
                "reserved_after": _int(c, "reserved_after", w),
                "peak_allocated": _int(c, "peak_allocated", w),
                "pid": c.get("pid", 0) if isinstance(c.get("pid", 0), int) else 0,
            }
        )
    out_samples = []
    for i, s in enumerate(samples):
        w = f"{path}: device_samples[{i}]"
        if not isinstance(s, dict):
            raise InputError(f"{w}: must be an object")
        out_samples.append(
            {
                "t_s": _num(s, "t_s", w),
                "used": _int(s, "used", w),
                "total": _int(s, "total", w),
                "reserved": _int(s, "reserved", w),
                "allocated": _int(s, "allocated", w),
                "device": s.get("device", 0) if isinstance(s.get("device", 0), int) else 0,
            }
        )
    return {
        "name": name,
        "truth": read_truth(doc.get("truth"), path),
        "calls": out_calls,
        "samples": out_samples,
    }


# ---------------------------------------------------------------- conversion


def to_profile_results(sl: dict, calls: list[dict], gross: str = "peak") -> list:
    """stormlog ProfileResults, built the way `GPUMemoryProfiler.profile_function` builds them.

    Before/after snapshots carry the call's allocated/reserved counters at its start/end time.
    The allocator's cumulative allocated/freed byte counters (`allocated_bytes.all.allocated`
    / `.freed`), which stormlog differences across a call, are not in the export; the bytes the
    call allocated are taken as `peak_allocated - allocated_before` (the least the allocator
    counted) and freed as `peak_allocated - allocated_after`, then passed through stormlog's own
    `_allocated_and_freed`. The inactive-split counter is not in the export either: it is 0,
    what stormlog reads when `memory_stats()` lacks it.

    `gross="net"` instead hands stormlog no allocator totals, so it takes the call's net growth
    (its own fallback for allocators without those counters).
    """
    snap, result = sl["MemorySnapshot"], sl["ProfileResult"]
    out = []
    for c in calls:
        peak = max(c["peak_allocated"], c["allocated_before"], c["allocated_after"])

        def snapshot(t: float, alloc: int, reserved: int, op: str):
            return snap(
                timestamp=t,
                allocated_memory=alloc,
                reserved_memory=reserved,
                max_memory_allocated=peak,
                max_memory_reserved=max(c["reserved_before"], c["reserved_after"]),
                active_memory=0,
                inactive_memory=0,
                cpu_memory=0,
                device_id=0,
                operation=op,
            )

        before = snapshot(
            c["start_s"], c["allocated_before"], c["reserved_before"], f"before_{c['function']}"
        )
        after = snapshot(
            c["end_s"], c["allocated_after"], c["reserved_after"], f"after_{c['function']}"
        )
        totals = (peak - c["allocated_before"], peak - c["allocated_after"])
        allocated, freed = sl["allocated_and_freed"](
            None if gross == "net" else (0, 0),
            None if gross == "net" else totals,
            before,
            after,
        )
        peak_snap = snapshot(
            c["end_s"],
            peak,
            max(c["reserved_before"], c["reserved_after"]),
            f"peak_{c['function']}",
        )
        out.append(
            result(
                function_name=c["function"],
                execution_time=max(0.0, c["end_s"] - c["start_s"]),
                memory_before=before,
                memory_after=after,
                memory_peak=peak_snap,
                memory_allocated=allocated,
                memory_freed=freed,
                tensors_created=0,
                tensors_deleted=0,
            )
        )
    return out


def to_events(sl: dict, samples: list[dict], pid: int) -> list:
    """stormlog telemetry events (schema v4 'sample' records, as its CUDA tracker writes)."""
    out = []
    prev = None
    for s in sorted(samples, key=lambda s: s["t_s"]):
        used = min(s["used"], s["total"])
        change = 0 if prev is None else s["allocated"] - prev
        prev = s["allocated"]
        out.append(
            sl["event_from_record"](
                {
                    "schema_version": 4,
                    "session_id": "stormlog-peer",
                    "timestamp_ns": int(round(s["t_s"] * 1e9)),
                    "event_type": "sample",
                    "collector": "stormlog.cuda_tracker",
                    "sampling_interval_ms": 500,
                    "pid": pid,
                    "host": "corpus",
                    "device_id": s["device"],
                    "allocator_allocated_bytes": s["allocated"],
                    "allocator_reserved_bytes": s["reserved"],
                    "allocator_active_bytes": None,
                    "allocator_inactive_bytes": None,
                    "allocator_change_bytes": change,
                    "device_used_bytes": used,
                    "device_free_bytes": s["total"] - used,
                    "device_total_bytes": s["total"],
                    "context": None,
                    "metadata": {},
                }
            )
        )
    return out


def analyze(sl: dict, sc: dict, gross: str = "peak") -> dict:
    """Runs stormlog once per process (calls by pid) and once per device (samples by device),
    as a user with one profiler and tracker per process would; returns the reports and the
    inputs stormlog received."""
    analyzer_cls = sl["MemoryAnalyzer"]
    pids = sorted({c["pid"] for c in sc["calls"]})
    devices = sorted({s["device"] for s in sc["samples"]})
    runs = []
    for i, pid in enumerate(pids or [0]):
        calls = [c for c in sc["calls"] if c["pid"] == pid]
        results = to_profile_results(sl, calls, gross)
        # Telemetry goes with the first process's run; further devices get their own runs.
        events = None
        if i == 0 and devices:
            events = to_events(sl, [s for s in sc["samples"] if s["device"] == devices[0]], pid)
        report = analyzer_cls().generate_optimization_report(results, events)
        runs.append({"pid": pid, "results": results, "events": events or [], "report": report})
    for dev in devices[1:]:
        events = to_events(sl, [s for s in sc["samples"] if s["device"] == dev], 0)
        report = analyzer_cls().generate_optimization_report([], events)
        runs.append({"pid": None, "results": [], "events": events, "report": report})
    return {"runs": runs}


# ---------------------------------------------------------------- judging


def problems_of(report: dict) -> list[dict]:
    """stormlog's warning/critical items, most severe first, in stormlog's own priority order:
    critical patterns, high-impact insights, critical gap findings, then warning patterns and
    warning gap findings (its `recommendations` order, with the gap findings placed by
    severity). Patterns and insights of severity 'info' / impact medium or low are not problems
    (stormlog leaves them out of its recommendations)."""
    items = []
    for p in report.get("all_patterns", []):
        if p["severity"] in SEVERITY_RANK:
            items.append(
                (
                    SEVERITY_RANK[p["severity"]],
                    0,
                    {
                        "kind": p["pattern_type"],
                        "severity": p["severity"],
                        "class": PATTERN_CLASS.get(p["pattern_type"]),
                        "functions": list(p.get("affected_functions") or []),
                        "description": p["description"],
                    },
                )
            )
    for ins in report.get("all_insights", []):
        if ins["impact"] == "high":
            items.append(
                (
                    0,
                    1,
                    {
                        "kind": f"{ins['category']}: {ins['title']}",
                        "severity": "high",
                        "class": INSIGHT_CLASS.get(ins["category"]),
                        "functions": [],
                        "description": ins["description"],
                    },
                )
            )
    for g in report.get("gap_analysis", []):
        if g["severity"] in SEVERITY_RANK:
            items.append(
                (
                    SEVERITY_RANK[g["severity"]],
                    2,
                    {
                        "kind": f"gap {g['classification']}",
                        "severity": g["severity"],
                        "class": GAP_CLASS.get(g["classification"]),
                        "functions": [],
                        "description": g["description"],
                    },
                )
            )
    items.sort(key=lambda x: (x[0], x[1]))  # stable: stormlog's order within a group
    return [x[2] for x in items]


def is_cause(problem: dict, truth: Truth, sites: dict[str, set[str]]) -> bool:
    """Class matches; and when the problem names functions and the truth names locations, one
    named function was decorated at a `file:line` the truth accepts."""
    if problem["class"] != truth.cls:
        return False
    if not truth.locations or not problem["functions"]:
        return True
    return any(sites.get(f, set()) & set(truth.locations) for f in problem["functions"])


def judge(sc: dict, problems: list[dict]) -> dict:
    truth = sc["truth"]
    sites: dict[str, set[str]] = {}
    for c in sc["calls"]:
        sites.setdefault(c["function"], set()).add(f"{c['file']}:{c['line']}")
    first = problems[0] if problems else None
    if truth.healthy:
        return {
            "pass": not problems,
            "strict": not problems,
            "located": False,
            "tp": 0,
            "fp": len(problems),
            "fn": 0,
            "reason": "" if not problems else f"healthy, but {len(problems)} problem(s)",
        }
    hits = sum(1 for p in problems if is_cause(p, truth, sites))
    first_hit = first is not None and is_cause(first, truth, sites)
    if first_hit:
        reason = ""
    elif first is None:
        reason = "no problem reported"
    elif first["class"] != truth.cls:
        reason = f"first problem is {first['kind']}, not {truth.cls}"
    else:
        named = ", ".join(sorted(s for f in first["functions"] for s in sites.get(f, ())))
        reason = f"first problem names {named}, not {' or '.join(truth.locations)}"
    located = first_hit and bool(truth.locations) and bool(first["functions"])
    # Our harness's rule without bytes: where the truth names locations, the first problem
    # must name one (a problem that names no function cannot).
    strict = first_hit and (not truth.locations or located)
    return {
        "pass": first_hit,
        "located": located,
        "strict": strict,
        "tp": int(hits > 0),
        "fp": len(problems) - hits,
        "fn": int(hits == 0),
        "reason": reason,
    }


def ratio(n: int, d: int) -> float:
    return 1.0 if d == 0 else n / d


def totals(rows: list[dict]) -> dict:
    t = {"scenarios": len(rows), "healthy": 0, "faulty": 0, "passed": 0}
    t.update(tp=0, fp=0, fn=0)
    first_right = quiet = 0
    t["located"] = t["with_locations"] = t["strict_passed"] = 0
    for r in rows:
        j = r["judgement"]
        t["strict_passed"] += int(j["strict"])
        if not r["truth"]["healthy"] and r["truth"]["locations"]:
            t["with_locations"] += 1
            t["located"] += int(j.get("located", False))
        t["passed"] += int(j["pass"])
        for k in ("tp", "fp", "fn"):
            t[k] += j[k]
        if r["truth"]["healthy"]:
            t["healthy"] += 1
            quiet += int(j["pass"])
        else:
            t["faulty"] += 1
            first_right += int(j["pass"])
    t["precision"] = ratio(t["tp"], t["tp"] + t["fp"])
    t["recall"] = ratio(t["tp"], t["tp"] + t["fn"])
    t["first_right"] = ratio(first_right, t["faulty"])
    t["healthy_quiet"] = ratio(quiet, t["healthy"])
    return t


def label(p: dict, sc: dict) -> str:
    where = ""
    if p["functions"]:
        sites = sorted(
            {
                f"{c['function']} ({c['file']}:{c['line']})"
                for c in sc["calls"]
                if c["function"] in p["functions"]
            }
        )
        where = " @ " + ", ".join(sites[:3]) + (" …" if len(sites) > 3 else "")
    return f"{p['severity']} {p['kind']}{where}"


def run_dir(sl: dict, folder: str, gross: str = "peak") -> list[dict]:
    paths = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not paths:
        raise InputError(f"{folder}: no *.json scenario files (run export-peer first)")
    rows = []
    for path in paths:
        sc = read_scenario(path)
        res = analyze(sl, sc, gross)
        problems = [p for run in res["runs"] for p in problems_of(run["report"])]
        # Several runs (processes, devices): most severe first across them, stable.
        problems.sort(key=lambda p: SEVERITY_RANK[p["severity"]])
        t = sc["truth"]
        rows.append(
            {
                "scenario": sc["name"],
                "truth": {"healthy": t.healthy, "class": t.cls, "locations": t.locations},
                "calls": len(sc["calls"]),
                "samples": len(sc["samples"]),
                "problems": [dict(p, label=label(p, sc)) for p in problems],
                "scores": [run["report"]["optimization_score"]["score"] for run in res["runs"]],
                "judgement": judge(sc, problems),
            }
        )
    return rows


def markdown(rows: list[dict], t: dict, version: str, gross: str) -> str:
    out = [
        f"stormlog {version}, `MemoryAnalyzer().generate_optimization_report` with its defaults "
        f"(bytes a call allocated: {'peak minus before' if gross == 'peak' else 'net growth'})",
        "",
        "| Scenario | Truth | stormlog's problems, most severe first | Pass |",
        "|---|---|---|:---:|",
    ]
    for r in rows:
        tr = r["truth"]
        truth = "healthy" if tr["healthy"] else tr["class"] + (
            f" @ {' or '.join(tr['locations'])}" if tr["locations"] else ""
        )
        found = "; ".join(p["label"] for p in r["problems"]) or "—"
        j = r["judgement"]
        mark = "yes" if j["pass"] else f"no ({j['reason']})"
        out.append(f"| {r['scenario']} | {truth} | {found} | {mark} |")
    out += [
        "",
        f"Totals: {t['passed']}/{t['scenarios']} pass; precision {t['precision']:.3f} "
        f"(tp {t['tp']}, fp {t['fp']}), recall {t['recall']:.3f} (fn {t['fn']}); "
        f"first finding right {t['first_right']:.3f} of {t['faulty']} faulty; "
        f"healthy with no alarm {t['healthy_quiet']:.3f} of {t['healthy']} healthy. "
        f"Of the {t['with_locations']} faulty scenarios whose truth names a location, "
        f"{t['located']} pass with a first problem that names a function (the others that pass "
        "do so on the class alone, their first problem naming no function); "
        f"with a location required wherever the truth names one, {t['strict_passed']}/"
        f"{t['scenarios']} pass.",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- self-test


def self_test(sl: dict) -> None:
    """Checks this script's conversion on samples/ (not stormlog's verdicts)."""
    checked = 0
    for path in sorted(glob.glob(os.path.join(SAMPLES, "*.json"))):
        sc = read_scenario(path)
        res = analyze(sl, sc)
        results = [r for run in res["runs"] for r in run["results"]]
        events = [e for run in res["runs"] for e in run["events"]]
        assert len(results) == len(sc["calls"]), (path, len(results), len(sc["calls"]))
        assert len(events) == len(sc["samples"]), (path, len(events), len(sc["samples"]))
        for r, c in zip(results, sc["calls"]):
            assert r.function_name == c["function"]
            assert r.memory_diff() == c["allocated_after"] - c["allocated_before"], (path, c)
            assert r.memory_before.reserved_memory == c["reserved_before"]
            assert r.memory_after.reserved_memory == c["reserved_after"]
            assert r.peak_memory_usage() == c["peak_allocated"]
            assert r.memory_allocated == c["peak_allocated"] - c["allocated_before"]
            assert r.memory_allocated - r.memory_freed == r.memory_diff()
            assert abs(r.execution_time - (c["end_s"] - c["start_s"])) < 1e-9
        for e, s in zip(events, sorted(sc["samples"], key=lambda s: s["t_s"])):
            assert e.device_used_bytes == s["used"] and e.device_total_bytes == s["total"]
            assert e.allocator_reserved_bytes == s["reserved"]
            assert e.allocator_allocated_bytes == s["allocated"]
            assert e.timestamp_ns == int(round(s["t_s"] * 1e9))
        for run in res["runs"]:
            summary = run["report"]["summary"]
            assert summary["total_function_calls"] == len(run["results"])
            assert ("gap_analysis" in run["report"]) == bool(run["events"])
        checked += 1
        print(f"ok {sc['name']}: {len(results)} calls, {len(events)} samples")
    # The leak sample: 100 calls of +4 MiB at metrics.py:33 reach stormlog as such.
    leak = read_scenario(os.path.join(SAMPLES, "leak-metrics-4mib.json"))
    diffs = [r.memory_diff() for r in to_profile_results(sl, leak["calls"])]
    assert diffs == [4 << 20] * 100, diffs[:5]
    # Two processes get one analyzer run each, with their own calls; a second device's samples
    # get a run of their own.
    two = dict(leak)
    two["calls"] = [dict(c, pid=1 + i % 2) for i, c in enumerate(leak["calls"])]
    two["samples"] = leak["samples"] + [dict(x, device=1) for x in leak["samples"]]
    runs = analyze(sl, two)["runs"]
    assert [r["pid"] for r in runs] == [1, 2, None], [r["pid"] for r in runs]
    assert [len(r["results"]) for r in runs] == [50, 50, 0]
    n = len(leak["samples"])
    assert [len(r["events"]) for r in runs] == [n, 0, n]
    assert all(e.device_id == 1 for e in runs[2]["events"])
    # The judge: a class match naming a function decorated at a truth location is the cause;
    # the same function named at another line is not.
    sites = {"train_step": {"metrics.py:33"}}
    p = {"class": "leak", "functions": ["train_step"]}
    assert is_cause(p, Truth(False, "leak", ["metrics.py:33"]), sites)
    assert not is_cause(p, Truth(False, "leak", ["metrics.py:34"]), sites)
    spike = dict(p, **{"class": "spike"})
    assert not is_cause(spike, Truth(False, "leak", ["metrics.py:33"]), sites)
    assert checked >= 4, f"expected at least 4 samples in {SAMPLES}, found {checked}"
    print(f"self-test passed on {checked} samples (stormlog {sl['version']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", nargs="?", help="folder of <scenario>.json files (export-peer DIR)")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--json", metavar="FILE", help="write per-scenario results and totals")
    ap.add_argument(
        "--allocated",
        choices=("peak", "net"),
        default="peak",
        help="bytes a call allocated, as stormlog sees them: peak minus before (default; the "
        "least a real allocator counts) or the net growth (stormlog's fallback)",
    )
    ap.add_argument("--self-test", action="store_true", help="check the conversion on samples/")
    a = ap.parse_args()
    # scipy's pearsonr warns inside stormlog's correlation insight when a series is constant
    # (every healthy loop); the warning changes nothing in the report.
    warnings.filterwarnings("ignore", message="An input array is .*constant")
    sl = load_stormlog()
    if a.self_test:
        self_test(sl)
        return 0
    if not a.dir:
        ap.error("give the export folder, or --self-test")
    try:
        rows = run_dir(sl, a.dir, a.allocated)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = totals(rows)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            doc = {"stormlog": sl["version"], "allocated": a.allocated, "scenarios": rows}
            json.dump(dict(doc, totals=t), f, indent=1)
    if a.markdown or not a.json:
        sys.stdout.write(markdown(rows, t, sl["version"], a.allocated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
