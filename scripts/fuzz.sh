#!/usr/bin/env bash
# Fuzzes the trace decoder and the snapshot importer for a bounded time (default 60 s):
# scripts/fuzz.sh [SECONDS]. Both targets also check that reading stays within 8 times the
# input plus 64 MiB of heap (fuzz/fuzz_targets/budget.rs, a counting allocator). Seeds come from
# the checked-in golden trace, fresh synthetic traces, snapshot fixtures and memo bombs.
# cargo-fuzz needs nightly compiler flags; RUSTC_BOOTSTRAP=1 enables them on the pinned stable
# toolchain.
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
# Memo bombs (FORMAT.md, "Robustness"): the targets check the readers' memory budget.
python3 analysis-core/tests/assets/hostile/make.py "$snapshots" --small
# The same snapshot as JSON (380 KB, under -max_len), so the JSON reader is explored too.
python3 -c 'import json, pickle, sys; json.dump(pickle.load(open(sys.argv[1], "rb")), open(sys.argv[2], "w"))' \
  analysis-core/tests/assets/torch/ring-buffer.pickle "$snapshots/ring-buffer.json"
# The pickle and JSON parsers alone, from the same seeds.
mkdir -p fuzz/corpus/pickle
cp "$snapshots"/*.pickle "$snapshots"/*.json fuzz/corpus/pickle/
cd fuzz
# Half the time for the trace decoder, a quarter each for the snapshot importer and the parsers.
RUSTC_BOOTSTRAP=1 cargo fuzz run decode --sanitizer none -- \
  -max_total_time="$((secs / 2))" -max_len=65536 -rss_limit_mb=2048
RUSTC_BOOTSTRAP=1 cargo fuzz run snapshot --sanitizer none -- \
  -max_total_time="$((secs / 4))" -max_len=400000 -rss_limit_mb=2048
RUSTC_BOOTSTRAP=1 cargo fuzz run pickle --sanitizer none -- \
  -max_total_time="$((secs - secs / 2 - secs / 4))" -max_len=400000 -rss_limit_mb=2048
