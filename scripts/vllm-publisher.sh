#!/usr/bin/env bash
# Runs tests/interop/indexer_vllm.rs alone against vLLM's REAL KV-event publisher (no GPU), for one vLLM
# with positional events (0.23.0) and one with map16 events and the topic-carrying replay
# (0.33.0). scripts/setup-vllm-publishers.sh builds the environments once (under
# target/vllm-publishers; see scripts/vllm-publisher/README.md). scripts/test.sh runs the same
# test as part of the whole suite.
# usage: scripts/vllm-publisher.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LIST="$(bash "$ROOT/scripts/setup-vllm-publishers.sh")"
cd "$ROOT"
KVPLANE_VLLM_PUBLISHERS="$LIST" cargo test --test interop indexer_vllm:: -- --nocapture
