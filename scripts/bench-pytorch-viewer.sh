#!/usr/bin/env bash
# Benchmark of PyTorch's own snapshot viewer (not a test): loads each snapshot in MemoryViz.js,
# what pytorch.org/memory_viz runs, in headless Chromium, and prints one JSON line per file and
# round: time from choosing the file to the drawn Active Memory Timeline, the time of each load
# step, JS heap, or that the page timed out or crashed. For comparing our viewer's load time
# (scripts/bench-browser.sh with FILES=...) with PyTorch's on the same files;
# scripts/bench-vs-pytorch.sh runs both in interleaved rounds.
# Each file is read through before its load, so that it is in the OS page cache (COLD_FILE=1: not).
# Env: MEMORYVIZ_JS=path to PyTorch's MemoryViz.js (required; kept outside this repository),
# FILES="a.pickle b.pickle" (required), ROUNDS=1, TIMEOUT_S=180 (per file and round),
# SCREENSHOTS=dir (a picture of each drawn page, taken after the measurement).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [[ -z "${MEMORYVIZ_JS:-}" || ! -f "${MEMORYVIZ_JS:-}" ]]; then
  echo "MEMORYVIZ_JS must name PyTorch's MemoryViz.js. Download it (it is not in PyTorch's wheels)" >&2
  echo "from https://raw.githubusercontent.com/pytorch/pytorch/main/torch/utils/viz/MemoryViz.js" >&2
  echo "and keep it outside this repository." >&2
  exit 2
fi
[[ -n "${FILES:-}" ]] || { echo "FILES must name the snapshots to load (space-separated)" >&2; exit 2; }
ROUNDS=${ROUNDS:-1}
MEMORYVIZ_JS=$(realpath "$MEMORYVIZ_JS")
read -r -a PATHS <<< "$FILES"
for f in "${PATHS[@]}"; do [[ -f "$f" ]] || { echo "no such file: $f" >&2; exit 2; }; done
ABS=$(realpath "${PATHS[@]}" | tr '\n' ' ')

# lib.mjs (launch()) imports playwright-core from tests/browser; other runs may be using that
# folder, so it is only installed when missing.
[[ -d tests/browser/node_modules/playwright-core ]] || (cd tests/browser && npm ci --no-audit --no-fund --silent)
(cd tests/browser/bench/pytorch-viewer && npm ci --no-audit --no-fund --silent)
for round in $(seq "$ROUNDS"); do
  ROUND=$round MEMORYVIZ_JS=$MEMORYVIZ_JS FILES=$ABS TIMEOUT_S=${TIMEOUT_S:-180} \
    node "$ROOT/tests/browser/bench/pytorch-viewer/bench.mjs"
done
