#!/usr/bin/env bash
# The embedded default: installs the build tools if missing, builds the browser viewer, builds
# gpucollect with the viewer inside, and serves it with the bundled demo traces and a local
# trace store (./gpucollect-store). Open the printed address in a browser.
#   scripts/serve-demo.sh [gpucollect serve options, e.g. --addr 0.0.0.0:8080 --upload-token T]
# (on an address other machines can reach, uploads need a token or --allow-anonymous-uploads)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tools.sh
trunk build --release --offline
exec cargo run --release -p gpucollect -- serve "$@"
