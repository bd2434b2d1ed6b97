#!/usr/bin/env bash
# Every test gpucollect has, in the order CI runs them. Needs the tools .ci/run installs.
# GPUCOLLECT_FUZZ_SECS (default 30) bounds the decoder fuzzing; 0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "format"
cargo fmt --all --check

step "no module imports a module that imports it back"
python3 scripts/check-module-cycles.py

step "clippy (native)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "clippy (wasm32: analysis-core without std, viewer)"
cargo clippy -p analysis-core -p gpucollect-trace -p gpucollect-torch-import --no-default-features --target wasm32-unknown-unknown --locked -- -D warnings
cargo clippy -p viewer --target wasm32-unknown-unknown --locked -- -D warnings

step "gpucollect without the server feature: no tokio, axum or object_store, and lint-clean"
if cargo tree -p gpucollect --no-default-features --locked | grep -E '(tokio|axum|object_store) v'; then
  echo "gpucollect --no-default-features pulls in the server's dependencies (above)" >&2
  exit 1
fi
cargo clippy -p gpucollect --no-default-features --all-targets --locked -- -D warnings
cargo test -p gpucollect --no-default-features --bin gpucollect --locked

step "no_std build of analysis-core for wasm32-unknown-unknown"
cargo build -p analysis-core --no-default-features --target wasm32-unknown-unknown --locked

step "API docs (rustdoc; broken links and bad markup are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "unit, property, golden, compatibility and end-to-end tests"
cargo test --workspace --locked

step "browser tests (viewer built with trunk, headless Chromium)"
scripts/test-browser.sh

step "decoder fuzzing (${GPUCOLLECT_FUZZ_SECS:-30} s)"
if [ "${GPUCOLLECT_FUZZ_SECS:-30}" != 0 ]; then
  scripts/fuzz.sh "${GPUCOLLECT_FUZZ_SECS:-30}"
fi

step "all tests passed"
