#!/usr/bin/env bash
# Overhead of `gpucollect PROGRAM` per intercepted cuMemAlloc_v2 + cuMemFree_v2 pair, on the fake
# CUDA driver (no GPU needed): the same loop of N pairs run bare, traced without stacks, and
# traced with stacks at a call depth that gives 32 recorded frames. Prints ns per pair, the added
# ns, events/s, and the dropped-event count from each trace (must be 0).
# Then the same for a Python loop calling the driver through ctypes, 20 Python frames deep
# (tests/fake-cuda/python_bench.py; PY_PAIRS pairs, $PYTHON): bare, without stacks, with
# native frames only (--no-python-frames), and with Python frames (the default).
#
# Usage: scripts/bench-overhead.sh [PAIRS]   (default 1000000; PY_PAIRS default 200000)
# Needs: cargo build --release -p gpucollect -p gpucollect-inject ; gcc; python3 (3.11+ for
# Python frames; PYTHON=... picks another interpreter, PYTHON= skips the Python part).
set -eu
cd "$(dirname "$0")/.."
N=${1:-1000000}
PY_PAIRS=${PY_PAIRS:-200000}
PYTHON=${PYTHON-python3}
BIN=${BIN:-target/release}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
S=tests/fake-cuda
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$W/libcuda.so.1" $S/libcuda.c -ldl -lpthread
gcc -shared -fPIC -O2 -o "$W/libcupti.so" $S/libcupti.c -L"$W" -l:libcuda.so.1 -Wl,-rpath,"$W"
gcc -O2 -g -fno-omit-frame-pointer -o "$W/scenarios" $S/scenarios.c $S/fake_nvtx.c -L"$W" -l:libcuda.so.1 -Wl,-rpath,"$W" -lpthread
export GPUCOLLECT_CUPTI_PATH="$W/libcupti.so"
pair_ns() { sed -n 's/.*ns_per_pair=\([0-9.]*\).*/\1/p'; }
eps() { sed -n 's/.*events_per_sec=\([0-9]*\).*/\1/p'; }
dropped() { "$BIN/gpucollect" report --format json "$1" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["dropped_events"], r["alloc_count"])'; }

base_out=$("$W/scenarios" bench "$N" 26)
base=$(echo "$base_out" | pair_ns)
printf "%-30s %s ns/pair\n" "bare:" "$base"
for mode in "--no-stacks" "--stack-depth 32" "--stack-depth 32 --unwind fp"; do
    out=$("$BIN/gpucollect" --no-nvml $mode -o "$W/t.msgpack" "$W/scenarios" bench "$N" 26)
    ns=$(echo "$out" | pair_ns)
    read -r drop allocs < <(dropped "$W/t.msgpack")
    printf '%-30s %s ns/pair, +%s ns/pair, %s events/s, %s allocs traced, %s dropped\n' \
        "$mode:" "$ns" "$(python3 -c "print(round($ns - $base, 1))")" "$(echo "$out" | eps)" "$allocs" "$drop"
done

[ -n "$PYTHON" ] || exit 0
pybench() { "$@" "$PYTHON" $S/python_bench.py "$W/libcuda.so.1" "$PY_PAIRS" 20; }
base=$(pybench | pair_ns)
printf "%-42s %s ns/pair\n" "python ($("$PYTHON" -V 2>&1)), bare:" "$base"
for mode in "--no-stacks" "--stack-depth 32 --no-python-frames" "--stack-depth 32"; do
    out=$(pybench "$BIN/gpucollect" --no-nvml $mode -o "$W/t.msgpack")
    ns=$(echo "$out" | pair_ns)
    read -r drop allocs < <(dropped "$W/t.msgpack")
    printf '%-42s %s ns/pair, +%s ns/pair, %s allocs traced, %s dropped\n' \
        "python, $mode:" "$ns" "$(python3 -c "print(round($ns - $base, 1))")" "$allocs" "$drop"
done
