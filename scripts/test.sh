#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests, and the interop tests
# against the real LMCache 0.5.6 (its Python environment is set up first, idempotently).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== python environment for the LMCache interop tests"
bash scripts/setup-python.sh
bash scripts/setup-browser.sh

echo "== cargo fmt --check"
cargo fmt --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

echo "== cargo test"
cargo test --lib --bins --tests --examples

echo "== doc tests"
cargo test --doc

echo "== benches compile (never timed in CI)"
cargo bench --no-run
