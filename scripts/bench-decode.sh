#!/usr/bin/env bash
# Decode+replay throughput of analysis-core, natively and as WebAssembly (wasm32-wasip1 under
# Node), on the same synthetic training trace. Usage: scripts/bench-decode.sh [EVENTS] [ROUNDS]
# Prints one JSON line per target; figures go to docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
events="${1:-10000000}"
rounds="${2:-5}"
# The hour's memory latency beside the figures (this VM's speed varies by the hour).
echo "host: $(scripts/host-latency.sh)" >&2
rustup target add wasm32-wasip1 >/dev/null 2>&1 || true
cargo build --quiet --release -p analysis-core --example bench_decode
cargo build --quiet --release -p analysis-core --example bench_decode --target wasm32-wasip1
./target/release/examples/bench_decode "$events" "$rounds"
node --no-warnings scripts/wasi-run.mjs \
  target/wasm32-wasip1/release/examples/bench_decode.wasm "$events" "$rounds"
