#!/usr/bin/env bash
# How `gpucollect report` scales with trace size: writes a synthetic training trace of each
# size with `gpucollect synth`, reports on it under `/usr/bin/time -v`, and prints one table row
# per size (events, trace bytes, bytes/event, wall time, max RSS, RSS per trace byte). Each trace
# is deleted once measured. Figures go to docs/benchmarks.md ("Scale").
#
# Usage: scripts/bench-scale.sh [EVENTS...]        (default: 3000000 30000000)
#   GPUCOLLECT=path      a gpucollect binary to use instead of building the release one
#   SCENARIO=name        synthetic scenario (default training-leak)
#   SYNTH_ARGS="..."     more arguments for `gpucollect synth` (e.g. "--out-of-order 16", or
#                        "--framework-capture")
#   SCALE_DIR=dir        where the traces are written (default: a temporary directory)
#
# `gpucollect synth` builds the whole trace in memory before writing it (about 12 bytes per
# event), and the report keeps the replayed model's history past 128 MiB in a temporary file in
# TMPDIR (about 1.3 times the trace): check free memory and disk, there and in SCALE_DIR, before
# asking for 300000000 events.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -eq 0 ]; then set -- 3000000 30000000; fi
for n in "$@"; do
  case "$n" in
    '' | *[!0-9]*) echo "bench-scale: '$n' is not a number of events" >&2; exit 2 ;;
  esac
done
if [ ! -x /usr/bin/time ]; then
  echo "bench-scale: /usr/bin/time is missing (Debian package 'time')" >&2
  exit 2
fi
# The hour's memory latency beside the figures (this VM's speed varies by the hour).
echo "host: $(scripts/host-latency.sh)" >&2

scenario="${SCENARIO:-training-leak}"
bin="${GPUCOLLECT:-}"
if [ -z "$bin" ]; then
  cargo build --quiet --release -p gpucollect
  bin=./target/release/gpucollect
fi
dir="${SCALE_DIR:-$(mktemp -d)}"
mkdir -p "$dir"
trace="$dir/bench-scale.gpumem"
timing="$dir/bench-scale.time"
cleanup() { rm -f "$trace" "$timing"; [ -n "${SCALE_DIR:-}" ] || rmdir "$dir" 2>/dev/null || true; }
trap cleanup EXIT

read -r -a synth_args <<< "${SYNTH_ARGS:-}"
echo "scenario $scenario ${SYNTH_ARGS:-}, $(nproc) cores, $("$bin" --version 2>/dev/null || echo gpucollect)"
printf '| %s | %s | %s | %s | %s | %s |\n' \
  Events 'Trace bytes' Bytes/event 'Wall time' 'Max RSS' 'RSS / trace bytes'
echo '|---:|---:|---:|---:|---:|---:|'
for n in "$@"; do
  "$bin" synth "$scenario" --events "$n" --seed 1 "${synth_args[@]}" --output "$trace"
  bytes=$(stat -c %s "$trace")
  /usr/bin/time -v -o "$timing" "$bin" report "$trace" >/dev/null
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$timing")
  rss_kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$timing")
  awk -v n="$n" -v b="$bytes" -v w="$wall" -v r="$rss_kib" 'BEGIN {
    # wall is [h:]m:ss.ss
    k = split(w, p, ":"); s = 0; for (i = 1; i <= k; i++) s = s * 60 + p[i];
    printf "| %.0f | %.0f | %.2f | %.2f s | %.0f MiB | %.2f |\n",
      n, b, b / n, s, r / 1024, r * 1024 / b
  }'
  rm -f "$trace"
done
