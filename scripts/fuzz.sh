#!/usr/bin/env bash
# Fuzzes the trace decoder for a bounded time (default 60 s): scripts/fuzz.sh [SECONDS]
# Seeds come from the checked-in golden trace and fresh synthetic traces. cargo-fuzz needs
# nightly compiler flags; RUSTC_BOOTSTRAP=1 enables them on the pinned stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
corpus=fuzz/corpus/decode
mkdir -p "$corpus"
cp analysis-core/tests/assets/v1.0/every-record-kind.msgpack "$corpus/golden-v1.0"
for s in training-leak multi-device context-reset oom; do
  cargo run --quiet -p gpucollect -- synth "$s" --events 300 -o "$corpus/synth-$s"
done
snapshots=fuzz/corpus/snapshot
mkdir -p "$snapshots"
cp analysis-core/tests/assets/torch/ring-buffer.pickle analysis-core/tests/assets/torch/real-torch.pickle "$snapshots/"
# The same snapshot as JSON (380 KB, under -max_len), so the JSON reader is explored too.
python3 -c 'import json, pickle, sys; json.dump(pickle.load(open(sys.argv[1], "rb")), open(sys.argv[2], "w"))' \
  analysis-core/tests/assets/torch/ring-buffer.pickle "$snapshots/ring-buffer.json"
cd fuzz
# Two thirds of the time for the trace decoder, the rest for the snapshot importer.
RUSTC_BOOTSTRAP=1 cargo fuzz run decode --sanitizer none -- \
  -max_total_time="$((secs * 2 / 3))" -max_len=65536 -rss_limit_mb=2048
RUSTC_BOOTSTRAP=1 cargo fuzz run snapshot --sanitizer none -- \
  -max_total_time="$((secs - secs * 2 / 3))" -max_len=400000 -rss_limit_mb=2048
