#!/usr/bin/env bash
# Runs the figures of docs/BENCHMARKS.md: `kvplane bench` against a fresh controller per
# measurement, RUNS times each, printing one JSON report per run (take the median).
#
#   scripts/bench-matrix.sh kvplane  [RUNS]   # release kvplane (built here)
#   scripts/bench-matrix.sh lmcache  [RUNS]   # LMCache 0.5.6's own controller (scripts/setup-python.sh)
#   KVPLANE_BIN=path/to/kvplane scripts/bench-matrix.sh …   # use a prebuilt binary
#
# Everything listens on 127.0.0.1. Set SCALES="1000000 10000000 50000000" to choose key counts.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-kvplane}
runs=${2:-3}
scales=${SCALES:-"1000000 10000000 50000000"}
# KVPLANE_BIN: a prebuilt binary (default: build release here).
if [ -n "${KVPLANE_BIN:-}" ]; then bin=$KVPLANE_BIN; else cargo build --release --quiet; bin=target/release/kvplane; fi
http=19900; pull=19830; reply=19840; hb=19882

start() {
  if [ "$target" = kvplane ]; then
    RUST_LOG=warn "$bin" serve --host 127.0.0.1 --port $http \
      --monitor-ports "{\"pull\":$pull,\"reply\":$reply,\"heartbeat\":$hb}" >/tmp/bench-ctl.log 2>&1 &
  else
    LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 .venv/bin/python tests/interop/run_lmcache_controller.py \
      --host 127.0.0.1 --port $http \
      --monitor-ports "{\"pull\":$pull,\"reply\":$reply,\"heartbeat\":$hb}" >/tmp/bench-ctl.log 2>&1 &
  fi
  ctl=$!
  for _ in $(seq 1 120); do
    curl -sf -o /dev/null "http://127.0.0.1:$http/controller/key-stats" && return 0
    sleep 0.25
  done
  echo "controller did not start" >&2; exit 1
}
stop() { kill "$ctl" 2>/dev/null || true; wait "$ctl" 2>/dev/null || true; sleep 0.5; }
bench() {
  "$bin" bench --pull 127.0.0.1:$pull --reply 127.0.0.1:$reply --http "http://127.0.0.1:$http" \
    --pid "$ctl" --timeout 900 --json "$@"
}
label() { echo "### $target $* (run $r)"; }

for r in $(seq 1 "$runs"); do
  start; label "ingest workers=10 ops=2000000"; bench --scenarios ingest --workers 10 --ops 2000000; stop
  start; label "ingest workers=1000 ops=2000000"; bench --scenarios ingest --workers 1000 --ops 2000000; stop
  for k in $scales; do
    start; label "lookup keys=$k"; bench --scenarios lookup --lookup-keys "$k" --lookup-requests 20000; stop
  done
  start; label "sync keys=1000000"; bench --scenarios sync --sync-keys 1000000; stop
  for w in 10 1000; do
    start; label "heartbeat workers=$w"; bench --scenarios heartbeat --heartbeat-workers "$w" --heartbeat-seconds 10; stop
  done
done
