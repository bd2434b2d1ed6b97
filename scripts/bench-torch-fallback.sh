#!/usr/bin/env bash
# Cost per tensor event of gpucollect's PyTorch Python fallback, on the fake torch and the fake
# CUDA stack (no GPU): reading torch.cuda.memory._snapshot()'s history and handing each entry
# to the injection library, as the capture's own counters measure it
# (GPUCOLLECT_FRAMEWORK_STATS=1: CPU time of the reading thread), with Python stacks (default) and without (--no-stacks).
# Usage: scripts/bench-torch-fallback.sh [TENSORS]  (env BIN: gpucollect, default target/release)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-100000}
bin=${BIN:-$root/target/release/gpucollect}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root/tests/fake-cuda"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$tmp/libcuda.so.1" libcuda.c -ldl -lpthread
gcc -shared -fPIC -O1 -o "$tmp/libcupti.so" libcupti.c -L"$tmp" -l:libcuda.so.1 -Wl,-rpath,"$tmp"
for mode in stacks no-stacks; do
  opts=(--no-nvml -o "$tmp/t.msgpack")
  [ "$mode" = no-stacks ] && opts+=(--no-stacks)
  out=$(GPUCOLLECT_CUPTI_PATH="$tmp/libcupti.so" FAKE_LIBCUDA="$tmp/libcuda.so.1" \
    GPUCOLLECT_FRAMEWORK_STATS=1 PYTHONPATH="$root/tests/fake-frameworks" \
    "$bin" "${opts[@]}" python3 "$root/tests/fake-frameworks/torch_bench.py" "$n" 2>&1 |
    grep 'tensor events handed over')
  # "gpucollect: torch: E history entries read, T tensor events handed over, snapshots S s,
  # handover H s"
  echo "$out" | awk -v m="$mode" '{ printf "%s: %d entries read, %d tensor events; per tensor event: handover %.2f us, snapshot reads %.2f us\n", m, $3, $7, $16 * 1e6 / $7, $13 * 1e6 / $7 }'
done
