#!/usr/bin/env bash
# Real-GPU validation of `gpucollect PROGRAM` (needs an NVIDIA GPU, nvcc, python3; PyTorch for
# the training-loop check). Builds tests/gpu/scenarios.cu, runs every scenario under gpucollect
# and checks each trace with scripts/gpu_trace_check.py; then a PyTorch loop (default allocator
# and expandable_segments) whose traced live bytes must equal torch.cuda.memory_reserved() at
# every sync point, whose tensors (framework blocks) must equal torch.cuda.memory_allocated()
# there, and whose allocations carry torch_loop.py's Python lines, with the step time against
# --no-framework (the slowdown of tensor capture); the three training-loop leaks
# (tests/gpu/torch_leaks.py) named at their lines by the report; CuPy's pool blocks against
# used_bytes() (tests/gpu/cupy_pool.py); stream-ordered pools
# and graph memory (tests/gpu/pools.cu); multi-process PyTorch (spawn, fork, torchrun;
# tests/gpu/multiproc.py); then the per-pair overhead on the real driver.
#
# Usage: scripts/gpu-check.sh [BIN_DIR]
#   BIN_DIR holds gpucollect and libgpucollect_inject.so (default: target/release; build them
#   with `cargo build --release -p gpucollect -p gpucollect-inject`). Results go to $OUT
#   (default /tmp/gpu-check). Exit status 1 when any check fails.
set -u
cd "$(dirname "$0")/.."
BIN=${1:-target/release}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
GC="$BIN/gpucollect"
# Each traced run is bounded, so one hang cannot take the whole lease (STEP_TIMEOUT seconds).
T=(timeout "${STEP_TIMEOUT:-150}")
fail=0

echo "== machine"
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo "no torch"

echo "== build scenarios"
nvcc -g -O0 -Xcompiler -fno-omit-frame-pointer -o "$OUT/scenarios" tests/gpu/scenarios.cu -lcuda || exit 1

for s in leak_exception async_free wrapper threads reset stream_ordered vmm oom sigkill kinds; do
    echo "== scenario $s"
    opts=()
    [ "$s" = wrapper ] && opts=(--hide-frame my_pool_alloc)
    "${T[@]}" "$GC" ${opts[@]+"${opts[@]}"} -o "$OUT/$s.msgpack" "$OUT/scenarios" "$s" >"$OUT/$s.log" 2>&1
    echo "gpucollect exit code $?"
    grep -v '^$' "$OUT/$s.log" | head -5
    python3 scripts/gpu_trace_check.py "$OUT/$s.msgpack" "$s" || fail=1
done
echo "== pools and graph memory (tests/gpu/pools.cu)"
if nvcc -g -O0 -o "$OUT/pools" tests/gpu/pools.cu; then
    "${T[@]}" "$GC" -o "$OUT/pools.msgpack" "$OUT/pools" >"$OUT/pools.log" 2>&1
    echo "gpucollect exit code $?"
    grep -v '^$' "$OUT/pools.log" | head -5
    python3 scripts/gpu_trace_check.py "$OUT/pools.msgpack" pools || fail=1
else
    echo "FAIL pools.cu does not build"; fail=1
fi
echo "== report of the planted leak"
"$GC" report "$OUT/leak_exception.msgpack" | head -14

if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    for conf in "" "expandable_segments:True"; do
        echo "== torch loop PYTORCH_CUDA_ALLOC_CONF=$conf"
        name=torch${conf:+-expandable}
        PYTORCH_CUDA_ALLOC_CONF=$conf "${T[@]}" "$GC" -o "$OUT/$name.msgpack" python3 tests/gpu/torch_loop.py "$OUT/${name}_points.json" >"$OUT/$name.log" 2>&1
        echo "gpucollect exit code $?"
        grep -v '^$' "$OUT/$name.log" | tail -3
        grep '^gpucollect:' "$OUT/$name.log" | head -3
        python3 scripts/gpu_trace_check.py "$OUT/$name.msgpack" torch "$OUT/${name}_points.json" || fail=1
        "$GC" report "$OUT/$name.msgpack" | sed -n '/^Verdict/,/^Iterations/p'
    done
    echo "== torch loop without tensor capture (--no-framework): step time for the slowdown"
    "${T[@]}" "$GC" --no-framework -o "$OUT/torch-nofw.msgpack" python3 tests/gpu/torch_loop.py "$OUT/torch_points_nofw.json" 2>/dev/null | grep step_ms
    GPUCOLLECT_CHECK_TENSORS=0 python3 scripts/gpu_trace_check.py "$OUT/torch-nofw.msgpack" torch "$OUT/torch_points_nofw.json" || fail=1
    echo "== torch loop bare (no gpucollect): step time"
    python3 tests/gpu/torch_loop.py "$OUT/torch_points_bare.json" | grep step_ms
    echo "== one tensor allocation+free (tests/gpu/torch_alloc_bench.py): bare, --no-framework, capture, capture --no-stacks"
    python3 tests/gpu/torch_alloc_bench.py
    "${T[@]}" "$GC" --no-framework -o /dev/null python3 tests/gpu/torch_alloc_bench.py 2>/dev/null
    "${T[@]}" "$GC" -o /dev/null python3 tests/gpu/torch_alloc_bench.py 2>/dev/null
    "${T[@]}" "$GC" --no-stacks -o /dev/null python3 tests/gpu/torch_alloc_bench.py 2>/dev/null
    echo "== torch leak patterns (tests/gpu/torch_leaks.py)"
    "${T[@]}" "$GC" -o "$OUT/torch_leaks.msgpack" python3 tests/gpu/torch_leaks.py >"$OUT/torch_leaks.log" 2>&1
    echo "gpucollect exit code $?"
    grep '^gpucollect:' "$OUT/torch_leaks.log" | head -5
    "$GC" report --format json "$OUT/torch_leaks.msgpack" >"$OUT/torch_leaks.json"
    python3 scripts/gpu_trace_check.py "$OUT/torch_leaks.msgpack" torch_leaks "$OUT/torch_leaks.json" || fail=1
    "$GC" report "$OUT/torch_leaks.msgpack" | sed -n '/^Verdict/,/^Iterations/p'
    echo "== report of the last torch loop (live at end by call site)"
    "$GC" report "$OUT/torch.msgpack" | sed -n '/Live at end/,$p' | head -12
    for mode in spawn fork ddp; do
        echo "== multi-process PyTorch: $mode"
        rm -rf "$OUT/mp-$mode"
        if [ "$mode" = ddp ]; then
            cmd=(python3 -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/multiproc.py ddp "$OUT/mp-$mode")
        else
            cmd=(python3 tests/gpu/multiproc.py "$mode" "$OUT/mp-$mode")
        fi
        "${T[@]}" "$GC" -o "$OUT/mp-$mode.msgpack" "${cmd[@]}" >"$OUT/mp-$mode.log" 2>&1
        echo "gpucollect exit code $?"
        grep -v '^$' "$OUT/mp-$mode.log" | tail -5
        python3 scripts/gpu_trace_check.py "$OUT/mp-$mode.msgpack" multiproc "$OUT/mp-$mode" || fail=1
        "$GC" report "$OUT/mp-$mode.msgpack" | grep -E '^  (process|device) |^Verdict|^  (WARNING|CRITICAL)' | head -12
    done
fi

if python3 -c 'import cupy' 2>/dev/null; then
    echo "== CuPy pool (tests/gpu/cupy_pool.py)"
    "${T[@]}" "$GC" -o "$OUT/cupy.msgpack" python3 tests/gpu/cupy_pool.py "$OUT/cupy_point.json" >"$OUT/cupy.log" 2>&1
    echo "gpucollect exit code $?"
    grep '^gpucollect:' "$OUT/cupy.log" | head -5
    python3 scripts/gpu_trace_check.py "$OUT/cupy.msgpack" cupy "$OUT/cupy_point.json" || fail=1
    "$GC" report "$OUT/cupy.msgpack" | sed -n '/^Verdict/,/^Iterations/p'
fi

echo "== overhead (cudaMalloc+cudaFree of 256 B, 20000 pairs)"
"$OUT/scenarios" bench 20000
"$GC" --no-stacks -o "$OUT/bench0.msgpack" "$OUT/scenarios" bench 20000 2>/dev/null | tail -1
"$GC" -o "$OUT/bench32.msgpack" "$OUT/scenarios" bench 20000 2>/dev/null | tail -1
exit $fail
