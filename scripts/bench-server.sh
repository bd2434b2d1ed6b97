#!/usr/bin/env bash
# Bounded load test of `gpucollect serve` on loopback: link loads (GET /t/<id>, the 303 a
# share link answers) and trace downloads with wrk, and upload throughput with curl.
# Usage: scripts/bench-server.sh [SECONDS] [CONNECTIONS]. Needs wrk and curl (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
conns="${2:-32}"
command -v wrk >/dev/null || { echo "install wrk: apt-get install wrk" >&2; exit 2; }
cargo build --quiet --release -p gpucollect
bin=target/release/gpucollect
work=$(mktemp -d)
trap 'kill $srv 2>/dev/null || true; rm -rf "$work"' EXIT
$bin serve --addr 127.0.0.1:18181 --store "$work/store" --max-upload 8GiB --demo-events 1000 \
  2>"$work/serve.log" &
srv=$!
for _ in $(seq 50); do curl -sf http://127.0.0.1:18181/healthz >/dev/null && break; sleep 0.1; done
$bin synth training-leak --events 2000000 -o "$work/big.msgpack"
$bin synth training-leak --events 20000 -o "$work/small.msgpack"
size=$(stat -c %s "$work/big.msgpack")
start=$(date +%s.%N)
curl -sf -X POST --data-binary @"$work/big.msgpack" http://127.0.0.1:18181/api/v1/traces >/dev/null
end=$(date +%s.%N)
echo "upload: $size bytes in $(echo "$end - $start" | bc) s = $(echo "$size / ($end - $start) / 1048576" | bc) MiB/s"
id=$(curl -sf -X POST --data-binary @"$work/small.msgpack" http://127.0.0.1:18181/api/v1/traces \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "link loads (GET /t/<id>), $conns connections, $secs s:"
wrk -t2 -c"$conns" -d"${secs}s" --latency "http://127.0.0.1:18181/t/$id" | grep -E "Requests/sec|99%|50%"
echo "trace downloads (GET /api/v1/traces/<id>, $(stat -c %s "$work/small.msgpack") bytes):"
wrk -t2 -c"$conns" -d"${secs}s" --latency "http://127.0.0.1:18181/api/v1/traces/$id" | grep -E "Requests/sec|99%|50%|Transfer"
