#!/usr/bin/env bash
# Server mode benchmark (not a test): a release `gpucollect serve` on loopback holding a
# synthetic training trace of EVENTS events (default 10000000), its summary made first, then
# headless Chromium opens the viewer on it in server mode (tests/browser/bench/served.mjs):
# navigation to first chart, and each zoom step from the click to the new window drawn.
# Env: EVENTS, DIST (viewer build, default target/dist-release: trunk build --offline --release
# --dist target/dist-release), STEPS, SUMMARY_MEMORY (the server's --summary-memory, default
# 8GiB: a summary is taken to need 4 bytes per trace byte, so 300M events need 16GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
EVENTS=${EVENTS:-10000000}
DIST=${DIST:-$ROOT/target/dist-release}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
[[ -f "$DIST/index.html" ]] || { echo "no viewer build in $DIST (trunk build --offline --release --dist $DIST)" >&2; exit 2; }
cargo build -q --release -p gpucollect
DIR=$ROOT/target/served-bench
mkdir -p "$DIR"
TRACE=$DIR/bench-$EVENTS.msgpack
[[ -s "$TRACE" ]] || target/release/gpucollect synth training-leak --events "$EVENTS" --seed 1 -o "$TRACE"
rm -rf "$DIR/store"
target/release/gpucollect serve --addr 127.0.0.1:0 --assets "$DIST" --store "$DIR/store" \
  --summary-memory "${SUMMARY_MEMORY:-8GiB}" --demo-events 1000 2> "$DIR/serve.log" &
PID=$!
trap 'kill "$PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q 'listening on' "$DIR/serve.log" && break; sleep 0.1; done
URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$DIR/serve.log" | head -n 1)
ID=$(curl -sf -X POST -T "$TRACE" "${URL}api/v1/traces" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')
[[ -n "$ID" ]] || { echo "the upload failed: $(cat "$DIR/serve.log")" >&2; exit 1; }
# The summary first: the figures are for a trace whose summaries exist.
start=$(date +%s%N)
curl -sf -o /dev/null "${URL}api/v1/traces/$ID/summary"
echo "summary made in $(( ($(date +%s%N) - start) / 1000000 )) ms; server RSS $(grep VmHWM /proc/$PID/status)"
(cd tests/browser && npm ci --no-audit --no-fund --silent)
SERVE_URL=$URL ID=$ID node tests/browser/bench/served.mjs
