#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit + integration tests, and the interop tests
# against the real LMCache 0.5.6 and vLLM's real KV-event publisher (their Python environments
# are set up first, idempotently).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== python environment for the LMCache interop tests"
bash scripts/setup-python.sh
bash scripts/setup-browser.sh
echo "== vLLM's real KV-event publisher (0.23.0, 0.33.0) for tests/interop/indexer_vllm.rs"
KVPLANE_VLLM_PUBLISHERS="$(bash scripts/setup-vllm-publishers.sh)"
export KVPLANE_VLLM_PUBLISHERS
echo "== the tokenizers library and transformers, the reference of tests/router/routing.rs's parity test"
KVPLANE_TOKENIZERS_PYTHON="$(bash scripts/setup-tokenizers.sh)"
export KVPLANE_TOKENIZERS_PYTHON
echo "== nats-server (Debian's package) for the cluster tests"
KVPLANE_NATS_SERVER="$(bash scripts/setup-nats.sh)"
export KVPLANE_NATS_SERVER
echo "== a real LMCache 0.5.6 MP fleet (the real torch; ~5 GB venv) for tests/interop/coordinator_fleet.rs"
KVPLANE_MP_FLEET_VENV="$(bash scripts/setup-mp-fleet.sh)"
export KVPLANE_MP_FLEET_VENV
echo "== LMCache 0.3.9, 0.3.11 and 0.4.7 beside that venv (~25 MB of wheels) for tests/interop/versions.rs"
KVPLANE_LMCACHE_VERSIONS="$(bash scripts/setup-lmcache-versions.sh)"
export KVPLANE_LMCACHE_VERSIONS

echo "== cargo fmt --check"
cargo fmt --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

echo "== the worker library alone: builds and lints without the server's dependencies"
cargo clippy --no-default-features --features worker --lib -- -D warnings
if cargo tree --no-default-features --features worker -e normal --prefix none \
    | grep -E '^(axum|prometheus|rust-embed|clap|tracing-subscriber|dashmap) '; then
    echo "the worker feature must not depend on the crates above" >&2
    exit 1
fi

echo "== the Docker build context is enough to build (a real docker build where Docker runs)"
bash scripts/check-docker-context.sh

echo "== cargo test"
cargo test --lib --bins --tests --examples

echo "== doc tests"
cargo test --doc

echo "== benches compile (never timed in CI)"
cargo bench --no-run

echo "== schemathesis against /openapi.json (no 5xx but the documented 504; --api-token rule)"
bash scripts/schemathesis.sh

echo "== fuzz smoke: every cargo-fuzz target briefly (property tests on decode run above)"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" bash scripts/fuzz-smoke.sh
