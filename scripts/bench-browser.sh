#!/usr/bin/env bash
# Viewer benchmark (not a test): release build, synthetic traces of 1 M and 10 M events, headless
# Chromium. Prints one JSON line per size: time from choosing the file to the first timeline,
# zoom-step frame time, wasm memory and JS heap relative to the trace size.
# Env: SIZES="1000000 10000000", SCENARIO=training-leak, DIST=dir (default dist/),
# SKIP_BUILD=1 reuses the build in DIST, FILES="a.pickle b.msgpack" measures those files instead
# (e.g. PyTorch snapshots made by analysis-core/tests/assets/torch/make_fixtures.py N OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TRACES=$ROOT/target/browser-bench
SIZES=${SIZES:-"1000000 10000000"}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

DIST=${DIST:-$ROOT/dist}
[[ -n "${SKIP_BUILD:-}" ]] || trunk build --offline --release --dist "$DIST"
cargo build -q --release -p gpucollect
mkdir -p "$TRACES"
[[ -n "${FILES:-}" ]] && SIZES=""
for n in $SIZES; do
  [[ -s "$TRACES/bench-$n.msgpack" ]] ||
    target/release/gpucollect synth "${SCENARIO:-training-leak}" --events "$n" --seed 1 -o "$TRACES/bench-$n.msgpack"
done
(cd tests/browser && npm ci --no-audit --no-fund --silent)
node tests/browser/server.mjs "$DIST" 0 "$TRACES" > "$TRACES/server.log" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q '^http' "$TRACES/server.log" && break; sleep 0.1; done
BASE_URL=$(head -n 1 "$TRACES/server.log") TRACES=$TRACES SIZES=$SIZES FILES="${FILES:-}" node tests/browser/bench.mjs
