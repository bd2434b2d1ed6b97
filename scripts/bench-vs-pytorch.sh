#!/usr/bin/env bash
# Benchmark (not a test): our viewer against PyTorch's (MemoryViz.js) on the same snapshots, in
# interleaved rounds: each round loads every file in PyTorch's viewer, then in each of our builds,
# one after the other, so that the machine's drifting speed (tens of percent within minutes on a
# shared machine) affects both alike. Prints one JSON line per load (tests/browser/bench/bench.mjs
# and tests/browser/bench/pytorch-viewer/bench.mjs say what they hold), then per file and viewer
# the median, min and max of the time from choosing the file to the painted frame that shows the
# first timeline, memory at rest and after the load, and PyTorch's time over ours.
# Env: MEMORYVIZ_JS=path to PyTorch's MemoryViz.js (required; kept outside this repository),
# FILES="a.pickle b.pickle" (required), ROUNDS=3, DIST="dir ..." (builds of ours, default dist/:
# build with `trunk build --offline --release`), TIMEOUT_S=180 (PyTorch's viewer, per file and
# round).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [[ -z "${MEMORYVIZ_JS:-}" || ! -f "${MEMORYVIZ_JS:-}" ]]; then
  echo "MEMORYVIZ_JS must name PyTorch's MemoryViz.js (see scripts/bench-pytorch-viewer.sh)" >&2
  exit 2
fi
[[ -n "${FILES:-}" ]] || { echo "FILES must name the snapshots to load (space-separated)" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
MEMORYVIZ_JS=$(realpath "$MEMORYVIZ_JS")
read -r -a PATHS <<< "$FILES"
for f in "${PATHS[@]}"; do [[ -f "$f" ]] || { echo "no such file: $f" >&2; exit 2; }; done
read -r -a DISTS <<< "${DIST:-$ROOT/dist}"
for d in "${DISTS[@]}"; do
  [[ -f "$d/index.html" ]] || { echo "no build in $d (trunk build --offline --release --dist $d)" >&2; exit 2; }
done

[[ -d tests/browser/node_modules/playwright-core ]] || (cd tests/browser && npm ci --no-audit --no-fund --silent)
[[ -d tests/browser/bench/pytorch-viewer/node_modules/d3 ]] || (cd tests/browser/bench/pytorch-viewer && npm ci --no-audit --no-fund --silent)

OUT=$ROOT/target/browser-bench
mkdir -p "$OUT"
PIDS=()
URLS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for i in "${!DISTS[@]}"; do
  node tests/browser/server.mjs "${DISTS[$i]}" 0 > "$OUT/vs-server-$i.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 50); do grep -q '^http' "$OUT/vs-server-$i.log" && break; sleep 0.1; done
  URLS+=("$(head -n 1 "$OUT/vs-server-$i.log")")
done
RESULTS=$OUT/vs-pytorch.jsonl
: > "$RESULTS"
for round in $(seq "$ROUNDS"); do
  for f in "${PATHS[@]}"; do
    abs=$(realpath "$f")
    ROUND=$round MEMORYVIZ_JS=$MEMORYVIZ_JS FILES=$abs TIMEOUT_S=${TIMEOUT_S:-180} \
      node tests/browser/bench/pytorch-viewer/bench.mjs | tee -a "$RESULTS"
    for i in "${!DISTS[@]}"; do
      BUILD=${DISTS[$i]} ROUND=$round BASE_URL=${URLS[$i]} FILES=$abs \
        node tests/browser/bench/bench.mjs | tee -a "$RESULTS"
    done
  done
done
node tests/browser/bench/vs-pytorch-summary.mjs "$RESULTS"
