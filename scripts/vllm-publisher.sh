#!/usr/bin/env bash
# Runs tests/indexer_vllm.rs against vLLM's REAL KV-event publisher (no GPU), for one vLLM with
# positional events (0.23.0) and one with map16 events and the topic-carrying replay (0.33.0).
# Builds each publisher environment once with shared/tools/vllm-publisher (downloads the vLLM
# wheel from PyPI, ~300 MB each, keeps only 2 files of it).
# usage: scripts/vllm-publisher.sh [DIR]     (default: target/vllm-publishers)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$ROOT/../shared/tools/vllm-publisher"
DIR="${1:-$ROOT/target/vllm-publishers}"
LIST=""
for VER in 0.23.0 0.33.0; do
  if [ ! -d "$DIR/$VER/shim" ]; then
    bash "$TOOLS/setup_real_publisher.sh" "$VER" "$DIR/$VER"
  fi
  LIST="$LIST${LIST:+:}$DIR/$VER"
done
cd "$ROOT"
KVPLANE_VLLM_PUBLISHERS="$LIST" cargo test --test indexer_vllm -- --nocapture
