#!/usr/bin/env bash
# Figures of `gpucollect serve` under attack, for docs/benchmarks.md: runs the abuse test
# (collector/tests/serve_abuse.rs) on a release build, each attack alone and then all
# together, against a real server on 127.0.0.1 (the attackers use 127.0.0.2-5). Every run is
# bounded (about 10 s) and stops by itself. Prints the server's peak RSS, /healthz latency
# during the attack and the server's CPU seconds per MiB of hostile input; the combined run
# also asserts /healthz p99 < 50 ms and RSS < 256 MiB.
# Usage: scripts/bench-server-abuse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
run() {
  env GPUCOLLECT_ABUSE_ATTACKS="$1" GPUCOLLECT_ABUSE_REPORT=1 ${2:+GPUCOLLECT_ABUSE_STRICT=1} \
    cargo test --quiet --release -p gpucollect --test serve_abuse -- --nocapture 2>&1 \
    | grep -E "^(attacks|server|/healthz)"
  echo
}
cargo test --quiet --release -p gpucollect --test serve_abuse --no-run
for a in idle slowloris uploads bombs; do run "$a"; done
run idle,slowloris,uploads,bombs strict
