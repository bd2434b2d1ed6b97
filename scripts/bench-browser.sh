#!/usr/bin/env bash
# Viewer benchmark (not a test): release build, synthetic traces of 1 M and 10 M events, headless
# Chromium. Prints one JSON line per size: time from choosing the file to the first timeline
# (first_timeline_ms: drawn; first_painted_ms: the end of the frame that shows it, the end point
# of scripts/bench-pytorch-viewer.sh),
# zoom-step frame time, wasm memory and JS heap relative to the trace size.
# Env: SIZES="1000000 10000000", SCENARIO=training-leak, DIST=dir (default dist/),
# SKIP_BUILD=1 reuses the build in DIST, COLD_FILE=1 does not read each file through before its
# load (by default it does, so that it is in the OS page cache, as for PyTorch's viewer's
# benchmark), FILES="a.pickle b.msgpack" measures those files instead
# (e.g. PyTorch snapshots made by analysis-core/tests/assets/torch/make_fixtures.py N OUT).
# Comparing builds: DIST="old-dist new-dist" (with SKIP_BUILD=1) and ROUNDS=5 run every build
# once per round, alternating (this machine's speed drifts by tens of percent within minutes, so
# builds measured one after the other do not compare), then print each build's median, min and
# max first-timeline time per input.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TRACES=$ROOT/target/browser-bench
SIZES=${SIZES:-"1000000 10000000"}
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

read -r -a DISTS <<< "${DIST:-$ROOT/dist}"
ROUNDS=${ROUNDS:-1}
# The hour's memory latency beside the figures (this VM's speed varies by the hour).
echo "host: $(scripts/host-latency.sh)" >&2
if [[ -z "${SKIP_BUILD:-}" ]]; then
  [[ ${#DISTS[@]} -eq 1 ]] || { echo "several DIST folders need SKIP_BUILD=1 (build each first)" >&2; exit 2; }
  trunk build --offline --release --dist "${DISTS[0]}"
fi
mkdir -p "$TRACES"
[[ -n "${FILES:-}" ]] && SIZES=""
# gpucollect makes the synthetic traces (not needed for FILES).
[[ -z "$SIZES" ]] || cargo build -q --release -p gpucollect
for n in $SIZES; do
  [[ -s "$TRACES/bench-$n.msgpack" ]] ||
    target/release/gpucollect synth "${SCENARIO:-training-leak}" --events "$n" --seed 1 -o "$TRACES/bench-$n.msgpack"
done
(cd tests/browser && npm ci --no-audit --no-fund --silent)
# One server per build.
PIDS=()
URLS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for i in "${!DISTS[@]}"; do
  [[ -f "${DISTS[$i]}/index.html" ]] || { echo "no build in ${DISTS[$i]} (trunk build --offline --release --dist ${DISTS[$i]})" >&2; exit 2; }
  node tests/browser/server.mjs "${DISTS[$i]}" 0 "$TRACES" > "$TRACES/server-$i.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do grep -q '^http' "$TRACES/server-$i.log" && break; sleep 0.1; done
  URLS+=("$(head -n 1 "$TRACES/server-$i.log")")
done
RESULTS=$TRACES/results.jsonl
: > "$RESULTS"
for round in $(seq "$ROUNDS"); do
  for i in "${!DISTS[@]}"; do
    BUILD=${DISTS[$i]} ROUND=$round BASE_URL=${URLS[$i]} TRACES=$TRACES SIZES=$SIZES FILES="${FILES:-}" \
      node tests/browser/bench/bench.mjs | tee -a "$RESULTS"
  done
done
if [[ $ROUNDS -gt 1 || ${#DISTS[@]} -gt 1 ]]; then
  node tests/browser/bench/bench-summary.mjs "$RESULTS"
fi
