#!/usr/bin/env bash
# Installs what building and testing gpucollect needs and a fresh machine lacks. Idempotent:
# each tool is skipped when the right version is already there.
#   scripts/install-tools.sh          # build tools (wasm targets, trunk, wasm-bindgen-cli)
#   scripts/install-tools.sh --test   # plus test tools (cargo-fuzz, Chromium, moto)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
have() { command -v "$1" >/dev/null 2>&1; }

rustup show active-toolchain >/dev/null
rustup target add wasm32-unknown-unknown wasm32-wasip1 >/dev/null

# Trunk 0.21.14 (0.22 needs a newer rustc). Building it takes about 12 minutes, once.
if ! trunk --version 2>/dev/null | grep -q "0.21.14"; then
  cargo install --locked trunk@0.21.14
fi
# wasm-bindgen-cli must equal the wasm-bindgen in Cargo.lock (and Trunk.toml). No --locked: one
# of its locked dependencies is missing from the index.
want=$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/version = |"/, ""); print; exit}' Cargo.lock)
if ! wasm-bindgen --version 2>/dev/null | grep -q " $want"; then
  cargo install "wasm-bindgen-cli@$want"
fi

if [ "${1:-}" = "--test" ]; then
  # gcc builds the fake CUDA stack, readelf (binutils) checks build ids, python3 runs the
  # Python-frame tests and moto.
  for t in gcc:gcc readelf:binutils python3:python3; do
    have "${t%%:*}" || apt-get install -y "${t#*:}" || { apt-get update && apt-get install -y "${t#*:}"; }
  done
  have cargo-fuzz || cargo install --locked cargo-fuzz
  if [ ! -x /usr/bin/chromium ]; then
    apt-get install -y chromium chromium-driver || { apt-get update && apt-get install -y chromium chromium-driver; }
  fi
  have moto_server || python3 -m pip install --quiet 'moto[server]'
  have node || { echo "Node.js is needed for the browser tests" >&2; exit 1; }
fi
