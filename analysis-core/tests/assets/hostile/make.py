"""Writes hostile inputs, the shapes analysis-core/tests/budget.rs builds in memory, as files:
for benchmarks (docs/benchmarks.md, "Hostile input") and for trying them on the CLI, the
server and the viewer. Each is refused with an error saying why, or read, within the readers'
budget of 8 times the input plus 64 MiB (FORMAT.md, "Robustness").

    python3 analysis-core/tests/assets/hostile/make.py OUT_DIR [--small]

(`--small`: only the two under 1 MB, memo-bomb.pickle and shared-traces.pickle, fuzzing seeds.)

nil-records.msgpack     a valid header, then 4 MiB of MessagePack nils (one malformed record
                        each): warnings capped, the rest counted
big-record.msgpack      a valid header, one unknown record of almost 16 MiB (half a million
                        31-byte strings), then an end record: read once, not again per piece
too-big.msgpack         a valid header, then a 17 MiB bin record: over the 16 MiB record limit
memo-bomb.pickle        a snapshot whose 2,000 segments share one memoized list of 2,000
                        blocks (100 KB naming 4 million blocks): refused, shared too often
shared-traces.pickle    a snapshot whose 2,000 device traces are one memoized list of 2,000
                        allocations: refused, shared too often
repeated-entry.pickle   one device trace naming one memoized allocation 4 million times
                        (2 bytes each): refused, too many entries for its size
tiny-entries.pickle     2 million distinct allocations of 19 bytes each: refused, too many
                        entries for its size
nones.pickle            32 million Nones (one byte each, 8 in memory): refused, too dense
empty-containers.json   10 million `[]` in one array: refused, too dense
tiny-samples.msgpack    5 million device samples of 3 bytes (56 in the model): stopped at the
                        model's budget of 16 times the bytes read plus 32 MiB
min-allocs.msgpack      4 million allocation records of 5 bytes, never freed: read, within 8x
open-ranges.msgpack     300,000 NVTX ranges that never end (8 bytes each): read, the first 256
                        followed, the rest counted in one warning
resets.msgpack          200,000 allocations each followed by a context reset: read, in linear
                        time
pools.msgpack           200,000 pool samples, each of a new pool: read, in linear time
processes.msgpack       100,000 processes with one allocation each, each followed by a
                        150-byte record of an unknown kind (so the model's budget allows them):
                        read, in linear time
"""
import os
import pickle
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "."
small = "--small" in sys.argv[2:]
os.makedirs(out, exist_ok=True)
MAGIC = b"gpucollect-trace"
HEADER = bytes([0x94, 0xA0 | len(MAGIC)]) + MAGIC + bytes([0x01, 0x00, 0x80])
MAX_RECORD_BYTES = 16 << 20


def write(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


def dump(name, obj):
    write(name, pickle.dumps(obj, protocol=4))


blocks = [{"address": b * 512, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": []}
          for b in range(2000)]
segment = {"device": 0, "total_size": 1 << 20, "allocated_size": 512, "active_size": 512,
           "requested_size": 512, "stream": 0, "segment_type": "large", "blocks": blocks}
dump("memo-bomb.pickle", {"segments": [dict(segment, address=i << 20) for i in range(2000)],
                          "device_traces": [[]]})
allocs = [{"action": "alloc", "addr": i * 512, "size": 512, "time_us": i} for i in range(2000)]
dump("shared-traces.pickle", {"segments": [], "device_traces": [allocs] * 2000})
if small:
    sys.exit(0)

write("nil-records.msgpack", HEADER + b"\xc0" * (4 << 20))
strings = (MAX_RECORD_BYTES - 64) // 32
write(
    "big-record.msgpack",
    HEADER + b"\x92\x63\xdd" + struct.pack(">I", strings) + (b"\xbf" + b"x" * 31) * strings + b"\x92\x1a\x05",
)
n = MAX_RECORD_BYTES + 1024
write("too-big.msgpack", HEADER + b"\x92\x63\xc6" + struct.pack(">I", n) + b"\0" * n)

dump("repeated-entry.pickle", {"segments": [], "device_traces": [[allocs[0]] * (4 << 20)]})
dump("tiny-entries.pickle", {"segments": [], "device_traces": [
    [{"action": "alloc", "size": 1, "addr": i * 512} for i in range(2 << 20)]]})
dump("nones.pickle", {"segments": [], "x": [None] * (32 << 20)})
write("empty-containers.json", b'{"segments": [], "x": [' + b",".join([b"[]"] * (10 << 20)) + b"]}")

# Trace records: [tag, fields...] as MessagePack arrays of small ints.
write("tiny-samples.msgpack", HEADER + b"\x92\x16\x00" * 5_000_000)
write("min-allocs.msgpack", HEADER + b"\x94\x10\x00\x01\x00" * 4_000_000)
write(
    "open-ranges.msgpack",
    HEADER + b"".join(b"\x93\x13\x01\xce" + struct.pack(">I", i) for i in range(300_000)),
)
# An allocation of 7 bytes on device 0 (dt 1), then a reset of (process 0, device 0) (dt 1).
write("resets.msgpack", HEADER + b"\x94\x10\x01\x07\x01\x94\x1b\x01\x00\x00" * 200_000)
# pool_sample: dt 1, device 0, pool i.
write(
    "pools.msgpack",
    HEADER + b"".join(b"\x94\x17\x01\x00\xce" + struct.pack(">I", i) for i in range(200_000)),
)
# An allocation (dt 1, size 1, the rest 0) of process i, then an unknown record (tag 99) of 150
# bytes.
write(
    "processes.msgpack",
    HEADER
    + b"".join(
        bytes([0x9B, 0x10, 1, 1, 0, 0, 0, 0, 0, 0, 0]) + b"\xce" + struct.pack(">I", i)
        + bytes([0x92, 0x63, 0xC4, 150]) + bytes(150)
        for i in range(100_000)
    ),
)
