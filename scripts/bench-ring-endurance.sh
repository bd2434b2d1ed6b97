#!/usr/bin/env bash
# Long-run benchmark of the capture path (not a test): a program on the fake CUDA driver keeps
# RATE cuMemAlloc_v2+cuMemFree_v2 pairs per second (2 events each; default 1,000,000 pairs/s =
# 2 M events/s) for SECONDS (default 3600) under `gpucollect` with default stacks, and says each
# second whether it kept its rate and its slowest pair, and at the end how many pushes found the
# ring full and waited for the collector, and in which seconds (the ring's own count: a stall, told apart from the
# program being descheduled, which also makes a slow pair). The trace goes to /dev/null (an hour at
# 2 M events/s is about 90 GB of trace); the collector still drains, encodes and writes it.
#
# Usage: scripts/bench-ring-endurance.sh [SECONDS] [RATE]
# Needs: cargo build --release -p gpucollect -p gpucollect-inject ; gcc.
# Prints the per-second lines to $OUT (default: a temp file, path printed) and the summary.
set -eu
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-3600}
RATE=${2:-1000000}
BIN=${BIN:-target/release}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
S=tests/fake-cuda
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$W/libcuda.so.1" $S/libcuda.c -ldl -lpthread
gcc -shared -fPIC -O2 -o "$W/libcupti.so" $S/libcupti.c -L"$W" -l:libcuda.so.1 -Wl,-rpath,"$W"
gcc -O2 -g -fno-omit-frame-pointer -o "$W/scenarios" $S/scenarios.c $S/fake_nvtx.c -L"$W" -l:libcuda.so.1 -Wl,-rpath,"$W" -lpthread
export GPUCOLLECT_CUPTI_PATH="$W/libcupti.so"
OUT=${OUT:-$(mktemp /tmp/ring-endurance.XXXXXX)}
echo "per-second lines: $OUT"
set +e
"$BIN/gpucollect" --no-nvml -o /dev/null "$W/scenarios" endurance "$SECONDS_TO_RUN" "$RATE" > "$OUT" 2> "$W/stderr"
rc=$?
set -e
grep '^endurance' "$OUT"
# The collector says how often the program found the ring full and waited (nothing: never).
waits=$(sed -n 's/.*the program waited for the collector \([0-9]*\) time.*/\1/p' "$W/stderr")
echo "pushes that found the ring full and waited: ${waits:-0}"
# When they waited: the collector names the seconds of the run with the most waits.
sed -n 's/.*time(s)\( in [0-9]* seconds\{0,1\} of the run: [^:]*\): the ring was.*/waits came\1/p' "$W/stderr"
awk -F'[ =]' '/^second=/ { for (i = 1; i < NF; i++) if ($i == "worst_pair_us") w = $(i + 1); if (w + 0 > 1000) n++ } END { printf "seconds with a pair over 1 ms: %d\n", n + 0 }' "$OUT"
exit $rc
