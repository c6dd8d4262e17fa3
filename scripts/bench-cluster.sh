#!/usr/bin/env bash
# Controller cluster figures (docs/CLUSTER.md, docs/BENCHMARKS.md "Controller cluster"): one
# nats-server, a `kvplane serve --cluster` leader, a standby on the same ports and R read
# replicas on their own HTTP ports; then `kvplane bench`:
#   1. replica-lag  — OPS ops pushed to the leader at full speed, the replicas' reported lag;
#   2. http-lookup  — POST /lookup throughput spread over 1, 2, … R replicas;
#   3. failover     — WORKERS workers, KEYS keys; once NATS acknowledged every change and the
#                     replicas (doing the standby's work) caught up, SIGKILL the leader: time
#                     to the first answered P2P lookup on the same sockets, full syncs asked,
#                     keys held. FAILOVER_AT_ONCE=1 kills right after NATS acknowledged (the
#                     standby may still be catching up: that time is included).
#
# Usage: scripts/bench-cluster.sh            (needs nats-server: scripts/setup-nats.sh)
# Env:   R (3), OPS (2000000), WORKERS (1000), KEYS (10000000), LOOKUP_KEYS (200000),
#        REQUESTS (20000), CONCURRENCY (4), LEASE_TTL (1.5), KVPLANE_BIN
set -euo pipefail
R="${R:-3}"
# shellcheck source=scripts/nats-bench-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/nats-bench-env.sh"

HTTP=$(fp); PULL=$(fp); REPLY=$(fp); HB=$(fp)
export KVPLANE_SERVE_HOST=127.0.0.1 KVPLANE_SERVE_CLUSTER="nats://127.0.0.1:$NP" KVPLANE_SERVE_CLUSTER_NAME=bench
export KVPLANE_SERVE_CLUSTER_LEASE_TTL="${LEASE_TTL:-1.5}" RUST_LOG=warn
export KVPLANE_SERVE_MONITOR_PORTS="{\"pull\": $PULL, \"reply\": $REPLY, \"heartbeat\": $HB}"
KVPLANE_SERVE_PORT=$HTTP "$BIN" serve 2>"$SD/leader.log" & LEADER=$!; PIDS+=($LEADER)
until ready "$HTTP"; do sleep 0.05; done
KVPLANE_SERVE_PORT=$HTTP "$BIN" serve 2>"$SD/standby.log" & PIDS+=($!)
RP=()
for _ in $(seq 1 "$R"); do
    p=$(fp); RP+=("$p")
    KVPLANE_SERVE_PORT=$p "$BIN" serve --replica 2>>"$SD/replicas.log" & PIDS+=($!)
done
for p in "${RP[@]}"; do until ready "$p"; do sleep 0.05; done; done
sleep 0.5
urls() { local out=(); for p in "$@"; do out+=("http://127.0.0.1:$p"); done; (IFS=,; echo "${out[*]}"); }
BENCH=("$BIN" bench --pull "127.0.0.1:$PULL" --reply "127.0.0.1:$REPLY" --http "http://127.0.0.1:$HTTP")

echo "== replica lag ($R replicas)"
"${BENCH[@]}" --scenarios replica-lag --replicas "$(urls "${RP[@]}")" \
    --ops "${OPS:-2000000}" --workers 10
for k in $(seq 1 "$R"); do
    echo "== http lookup over $k replica(s)"
    "${BENCH[@]}" --scenarios http-lookup --query-http "$(urls "${RP[@]:0:$k}")" \
        --workers 10 --lookup-keys "${LOOKUP_KEYS:-200000}" --lookup-requests "${REQUESTS:-20000}" \
        --concurrency "${CONCURRENCY:-4}"
done
echo "== http lookup on the leader alone"
"${BENCH[@]}" --scenarios http-lookup --workers 10 --lookup-keys "${LOOKUP_KEYS:-200000}" \
    --lookup-requests "${REQUESTS:-20000}" --concurrency "${CONCURRENCY:-4}"
echo "== failover (${WORKERS:-1000} workers, ${KEYS:-10000000} keys)"
"${BENCH[@]}" --scenarios failover --leader-pid "$LEADER" --keep $([ "${FAILOVER_AT_ONCE:-0}" = 1 ] || echo --replicas "$(urls "${RP[@]}")") \
    --workers "${WORKERS:-1000}" --ops "${KEYS:-10000000}" --timeout 600 \
    || { echo "== the standby's log"; grep -v '^ ' "$SD/standby.log" | tail -20; exit 1; }
