#!/usr/bin/env bash
# Real-browser tests of the viewer: builds the app with trunk, writes synthetic traces and their
# `gpucollect report --format json`, serves both on localhost, runs the specs of
# tests/browser/specs/ (one per view, page objects in tests/browser/pages/) through
# tests/browser/run.mjs in headless Chromium (playwright-core), then stops the server.
#
# Needs: trunk 0.21.14, wasm-bindgen-cli (= the version in Cargo.lock), node >= 18, Chromium at
# /usr/bin/chromium (or CHROMIUM=...). Screenshots go to test-artifacts/.
# Env: RELEASE=1 builds with --release; SKIP_BUILD=1 reuses dist/; SPEC="leaks timeline" runs those
# specs only (names of tests/browser/specs/*.spec.mjs); ONLY=text runs the tests whose name holds it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARTIFACTS=${ARTIFACTS:-$ROOT/test-artifacts}
TRACES=$ROOT/target/browser-traces
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [[ -z "${SKIP_BUILD:-}" ]]; then
  echo "== building the viewer (trunk)"
  trunk build --offline ${RELEASE:+--release}
fi

echo "== writing synthetic traces and reports"
cargo build -q -p gpucollect
GC=$ROOT/target/debug/gpucollect
mkdir -p "$TRACES" "$ARTIFACTS"
rm -f "$ARTIFACTS"/*.png
for s in spikes multi-device nvtx-leak training-leak clean fragmented; do
  "$GC" synth "$s" --events 20000 --seed 5 -o "$TRACES/$s.msgpack"
  "$GC" report "$TRACES/$s.msgpack" --format json > "$TRACES/$s.json"
done
# What `gpucollect diff` says of the leaking trace against the clean one (the Compare view).
"$GC" diff "$TRACES/training-leak.msgpack" "$TRACES/clean.msgpack" --format json > "$TRACES/diff-training-leak-clean.json"
# A PyTorch memory snapshot (pickle), and the single-file HTML report of a trace.
cp analysis-core/tests/assets/torch/two-devices.pickle "$TRACES/snapshot.pickle"
"$GC" report "$TRACES/snapshot.pickle" --format json > "$TRACES/snapshot.json"
"$GC" html "$TRACES/spikes.msgpack" --assets "$ROOT/dist" -o "$TRACES/report.html"
# Files of several MiB, read in several slices: a snapshot and a trace.
python3 analysis-core/tests/assets/torch/make_fixtures.py 60000 "$TRACES/big-snapshot.pickle" > /dev/null
"$GC" report "$TRACES/big-snapshot.pickle" --format json > "$TRACES/big-snapshot.json"
# The single-file HTML report of a snapshot (converted as it is read, then embedded).
"$GC" html "$TRACES/big-snapshot.pickle" --assets "$ROOT/dist" -o "$TRACES/snapshot-report.html"
# The same snapshot as JSON (its report is the pickle's: the traces are byte-identical).
python3 -c 'import json, pickle, sys; json.dump(pickle.load(open(sys.argv[1], "rb")), open(sys.argv[2], "w"))' \
  "$TRACES/big-snapshot.pickle" "$TRACES/big-snapshot-as.json"
"$GC" synth training-leak --events 400000 --seed 2 -o "$TRACES/big.msgpack"
"$GC" report "$TRACES/big.msgpack" --format json > "$TRACES/big.json"
# A trace cut at 60 %: decodes up to the cut, with a warning.
size=$(stat -c %s "$TRACES/spikes.msgpack")
head -c $((size * 6 / 10)) "$TRACES/spikes.msgpack" > "$TRACES/truncated.msgpack"
"$GC" report "$TRACES/truncated.msgpack" --format json > "$TRACES/truncated.json" || true
# Format major version 2: byte 18 is the major version right after the magic string.
python3 - "$TRACES/spikes.msgpack" "$TRACES/newer.msgpack" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
assert b[1:18] == b"\xb0gpucollect-trace" and b[18] == 1, "unexpected header layout"
b[18] = 2
open(sys.argv[2], "wb").write(b)
PY

echo "== installing the test driver"
(cd tests/browser && npm ci --no-audit --no-fund --silent)

echo "== serving dist/ on localhost"
node tests/browser/server.mjs "$ROOT/dist" 0 "$TRACES" > "$TRACES/server.log" 2>&1 &
SERVER_PID=$!
rm -rf "$TRACES/store"
"$GC" serve --addr 127.0.0.1:0 --assets "$ROOT/dist" --store "$TRACES/store" --demo-events 1000 \
  > /dev/null 2> "$TRACES/serve.log" &
SERVE_PID=$!
trap 'kill "$SERVER_PID" "$SERVE_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  grep -q 'listening on' "$TRACES/serve.log" && break
  sleep 0.1
done
SERVE_URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$TRACES/serve.log" | head -n 1)
echo "   gpucollect serve: $SERVE_URL"
for _ in $(seq 50); do
  grep -q '^http' "$TRACES/server.log" && break
  sleep 0.1
done
BASE_URL=$(head -n 1 "$TRACES/server.log")
echo "   $BASE_URL"

echo "== running the browser tests"
SERVE_URL=$SERVE_URL BASE_URL=$BASE_URL TRACES=$TRACES ARTIFACTS=$ARTIFACTS node tests/browser/run.mjs
