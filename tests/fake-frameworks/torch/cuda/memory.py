"""torch.cuda.memory of the fake torch: a caching allocator and its allocation history, with
PyTorch's semantics where gpucollect depends on them:

- Blocks are requests rounded up to 512 bytes, carved first-fit from the start of a free range
  of segments of at least 2 MiB taken from the driver (cuMemAlloc_v2 of the fake libcuda); a
  block over 1 MiB takes its whole free range where at most 1 MiB would remain (PyTorch's
  should_split for the large pool). Freed blocks go back to the cache (coalesced), never to the
  driver.
- memory_allocated() is the sum of live blocks' sizes. A block a side stream used
  (Tensor.record_stream) drops out of it when the tensor dies (free_requested), but returns to
  the cache only once that stream is done (free_completed, here at torch.cuda.synchronize()).
- _record_memory_history(enabled="all", stacks="python", max_entries=N) keeps the last N
  entries (a ring: older ones are overwritten); _snapshot()["device_traces"][device] lists them
  oldest first, each {"action", "addr", "size", "stream", "time_us", "frames"}: actions alloc
  (size = the request), free_requested, free_completed, segment_alloc, oom; frames are the
  Python frames innermost first ({"name", "filename", "line"}), the allocator's own excluded.
- Where torch loaded a libc10_cuda.so (torch/__init__.py), every action also goes to its
  trace trackers (fake_c10_cuda_record), whether history is on or not, as PyTorch's
  record_trace does.
"""

import collections
import ctypes
import os
import sys
import time

from .. import _c10_cuda  # set by torch/__init__.py before it imports torch.cuda

_ROUND = 512
_SEGMENT = 2 << 20
_SMALL = 1 << 20

_segments = []  # [base, size, free ranges: list of [start, end)]
_live = {}  # block address -> block size
_allocated = 0
_history = None  # deque of entries, or None when off
_stacks = False

_package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _frames():
    out = []
    f = sys._getframe(1)
    while f is not None:
        filename = f.f_code.co_filename
        if not os.path.abspath(filename).startswith(_package + os.sep):
            out.append({"name": f.f_code.co_name, "filename": filename, "line": f.f_lineno})
        f = f.f_back
    return out


# TraceEntry::Action of c10/cuda/CUDACachingAllocator.h.
_ACTIONS = {"alloc": 0, "free_requested": 1, "free_completed": 2, "segment_alloc": 3, "oom": 8}


def _record(action, addr, size):
    if _c10_cuda is not None:
        _c10_cuda.fake_c10_cuda_record(_ACTIONS[action], 0, addr, size)
    if _history is None:
        return
    _history.append(
        {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": 0,
            "time_us": time.time_ns() // 1000,
            "frames": _frames() if _stacks else [],
        }
    )


def _new_segment(block):
    from . import _driver

    size = max(_SEGMENT, (block + _SEGMENT - 1) // _SEGMENT * _SEGMENT)
    ptr = ctypes.c_uint64()
    rc = _driver.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size))
    if rc != 0:
        _record("oom", 0, block)
        import torch._C

        for observer in list(torch._C._oom_observers):
            observer(0, block, 0, 0)
        raise RuntimeError("CUDA out of memory (fake): tried to allocate %d bytes" % block)
    _record("segment_alloc", ptr.value, size)
    seg = [ptr.value, size, [[ptr.value, ptr.value + size]]]
    _segments.append(seg)
    return seg


def _alloc(request):
    global _allocated
    block = max(_ROUND, (request + _ROUND - 1) // _ROUND * _ROUND)
    for seg in _segments:
        for r in seg[2]:
            if r[1] - r[0] >= block:
                break
        else:
            continue
        break
    else:
        seg = _new_segment(block)
        r = seg[2][0]
    if block > _SMALL and r[1] - r[0] - block <= _SMALL:
        block = r[1] - r[0]
    addr = r[0]
    r[0] += block
    if r[0] == r[1]:
        seg[2].remove(r)
    _live[addr] = block
    _allocated += block
    _record("alloc", addr, request)
    return addr


_pending = []  # (address, block) freed while a side stream used them


def _free(addr, stream_used=False):
    global _allocated
    block = _live.pop(addr)
    _allocated -= block
    _record("free_requested", addr, block)
    if stream_used:
        _pending.append((addr, block))
    else:
        _complete(addr, block)


def _complete(addr, block):
    for seg in _segments:
        if seg[0] <= addr < seg[0] + seg[1]:
            ranges = seg[2]
            ranges.append([addr, addr + block])
            ranges.sort()
            merged = [ranges[0]]
            for r in ranges[1:]:
                if r[0] == merged[-1][1]:
                    merged[-1][1] = r[1]
                else:
                    merged.append(r)
            seg[2] = merged
            break
    _record("free_completed", addr, block)


def _synchronize():
    """The side streams are done: blocks freed while they used them go back to the cache."""
    while _pending:
        _complete(*_pending.pop(0))


def memory_allocated(device=None):
    return _allocated


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize):
    global _history, _stacks
    if enabled is None:
        _history = None
        return
    _history = collections.deque(maxlen=max_entries)
    _stacks = stacks in ("python", "all")


def _snapshot(device=None):
    return {
        "segments": [
            {"device": 0, "address": s[0], "total_size": s[1]} for s in _segments
        ],
        "device_traces": [list(_history) if _history is not None else []],
    }


if os.environ.get("FAKE_TORCH_NO_HISTORY") == "1":
    # A torch before 2.1: no allocation history to read.
    del _record_memory_history, _snapshot
