#!/usr/bin/env bash
# Cost per tensor event of gpucollect's PyTorch trace tracker, on the fake torch and the fake
# CUDA stack (no GPU): a copy of tests/fake-frameworks whose torch has the fake libc10_cuda.so
# (tests/fake-frameworks/fake_c10_cuda.cpp), so importing it builds gpucollect's C++ shim
# against its header and attaches the tracker. The fake allocator times its trackers
# (CLOCK_MONOTONIC around each action's tracker calls, in the allocating thread): the shim,
# gpucollect_framework_trace, its stack capture and the ring write. Per tensor event = that
# time over allocations + frees; it also counts the free_requested and segment actions the shim
# ignores, and two clock reads per action; then allocations alone, and frees with the ignored
# actions. With the stacks of the allocations (default: native and Python frames) and without
# (--no-stacks). Then the time `import torch` and the first tensor take: the first time (the shim
# is built), then five times each with the shim cached and with --no-framework (the difference
# is what framework capture adds at start-up).
# Usage: scripts/bench-torch-tracker.sh [TENSORS]  (env BIN: gpucollect, default target/release)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-100000}
bin=${BIN:-$root/target/release/gpucollect}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root/tests/fake-cuda"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$tmp/libcuda.so.1" libcuda.c -ldl -lpthread
gcc -shared -fPIC -O1 -o "$tmp/libcupti.so" libcupti.c -L"$tmp" -l:libcuda.so.1 -Wl,-rpath,"$tmp"
cp -r "$root/tests/fake-frameworks" "$tmp/fw"
mkdir -p "$tmp/fw/torch/lib"
g++ -shared -fPIC -O2 -std=c++17 -Wl,-soname,libc10_cuda.so -I"$tmp/fw/torch/include" \
  -o "$tmp/fw/torch/lib/libc10_cuda.so" "$tmp/fw/fake_c10_cuda.cpp"
for mode in stacks no-stacks; do
  opts=(--no-nvml -o "$tmp/t.msgpack")
  [ "$mode" = no-stacks ] && opts+=(--no-stacks)
  out=$(GPUCOLLECT_CUPTI_PATH="$tmp/libcupti.so" FAKE_LIBCUDA="$tmp/libcuda.so.1" \
    XDG_CACHE_HOME="$tmp/cache" PYTHONPATH="$tmp/fw" \
    "$bin" "${opts[@]}" python3 "$tmp/fw/torch_bench.py" "$n" 2>&1)
  echo "$out" | grep -q 'trace tracker (C++' || { echo "$out" >&2; exit 1; }
  # "tracker: C calls, T ns, A alloc calls, N ns"
  echo "$out" | grep '^tracker:' | awk -v m="$mode" -v n="$n" \
    '{ printf "%s: %d tracker calls for %d tensor events; per tensor event: %.3f us; per allocation: %.3f us; per free (with the ignored actions): %.3f us\n", m, $2, 2 * n, $4 / 1e3 / (2 * n), $9 / 1e3 / $6, ($4 - $9) / 1e3 / n }'
done
prog='import time; t = time.perf_counter(); import torch; torch.empty(512); print("import_ms %.2f" % ((time.perf_counter() - t) * 1e3))'
rm -rf "$tmp/cache"
run() {
  GPUCOLLECT_CUPTI_PATH="$tmp/libcupti.so" FAKE_LIBCUDA="$tmp/libcuda.so.1" \
    XDG_CACHE_HOME="$tmp/cache" PYTHONPATH="$tmp/fw" \
    "$bin" --no-nvml -o /dev/null "$@" python3 -c "$prog" 2>&1 | awk '/^import_ms/ { print $2 }'
}
echo "import torch and the first tensor, building the shim: $(run) ms"
cached=() bare=()
for _ in 1 2 3 4 5; do
  cached+=("$(run)")
  bare+=("$(run --no-framework)")
done
echo "import torch and the first tensor, shim cached: ${cached[*]} ms; with --no-framework: ${bare[*]} ms"
