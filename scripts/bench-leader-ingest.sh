#!/usr/bin/env bash
# The controller's applied ingest standalone and as a `--cluster` leader (no standby), same
# binary, same run, 3 rounds (docs/BENCHMARKS.md "Controller cluster"). Needs nats-server.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/nats-bench-env.sh"
for round in 1 2 3; do
  for mode in standalone leader; do
    HTTP=$(fp); PULL=$(fp); REPLY=$(fp); HB=$(fp)
    env=(KVPLANE_SERVE_HOST=127.0.0.1 KVPLANE_SERVE_PORT=$HTTP RUST_LOG=warn
         "KVPLANE_SERVE_MONITOR_PORTS={\"pull\": $PULL, \"reply\": $REPLY, \"heartbeat\": $HB}")
    if [ $mode = leader ]; then env+=(KVPLANE_SERVE_CLUSTER=nats://127.0.0.1:$NP KVPLANE_SERVE_CLUSTER_NAME=ing$round); fi
    env "${env[@]}" "$BIN" serve 2>/dev/null & P=$!
    until ready "$HTTP"; do sleep 0.05; done
    printf "%s round %s: " $mode $round
    "$BIN" bench --pull 127.0.0.1:$PULL --reply 127.0.0.1:$REPLY --http http://127.0.0.1:$HTTP \
      --scenarios ingest --workers 10 --ops 2000000 | head -1
    kill $P; wait $P 2>/dev/null || true
  done
done
