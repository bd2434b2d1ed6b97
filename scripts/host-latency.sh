#!/usr/bin/env bash
# The host's memory latency now (a benchmark aid, not a test): ns per dependent random 8-byte load
# over 32 MiB and over 1 GiB, one JSON line. Run it beside a benchmark to tell a busy hour of a
# shared machine from a slower build (docs/benchmarks.md). Needs 1 GiB of free memory.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
[[ target/host-latency -nt scripts/host_latency.rs ]] ||
  rustc -O --edition 2024 -o target/host-latency scripts/host_latency.rs
exec target/host-latency
