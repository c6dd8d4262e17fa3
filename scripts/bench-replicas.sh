#!/usr/bin/env bash
# Indexer read replicas (docs/CLUSTER.md): one nats-server, one `kvplane indexer --cluster`
# ingester and R `--replica`s; `kvplane bench indexer` publishes its vLLM event stream to the
# ingester and queries it; then the time until every replica's /readyz is 200 (caught up)
# after the bench returns.
#
# Usage: R=2 scripts/bench-replicas.sh        (needs nats-server: scripts/setup-nats.sh)
# Env:   R (replicas, 2), BLOCKS (1048576), QUERIES (200), KVPLANE_BIN
set -euo pipefail
R="${R:-2}"
# shellcheck source=scripts/nats-bench-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/nats-bench-env.sh"
CL=(--cluster "nats://127.0.0.1:$NP" --cluster-name bench)
IP=$(fp)
"$BIN" indexer --host 127.0.0.1 --port "$IP" "${CL[@]}" >/dev/null 2>&1 & IPID=$!; PIDS+=($IPID)
RP=()
for _ in $(seq 1 "$R"); do
    p=$(fp); RP+=("$p")
    "$BIN" indexer --host 127.0.0.1 --port "$p" "${CL[@]}" --replica >/dev/null 2>&1 & PIDS+=($!)
done
until ready "$IP"; do sleep 0.05; done
for p in "${RP[@]}"; do until ready "$p"; do sleep 0.05; done; done
"$BIN" bench indexer --url "http://127.0.0.1:$IP" --pid "$IPID" \
    --blocks "${BLOCKS:-1048576}" --queries "${QUERIES:-200}"
T0=$(date +%s.%N)
for p in "${RP[@]}"; do until ready "$p"; do sleep 0.01; done; done
T1=$(date +%s.%N)
echo "replicas ($R) caught up $(python3 -c "print(round($T1 - $T0, 3))") s after the bench returned"
for p in "${RP[@]}"; do curl -s "http://127.0.0.1:$p/readyz"; echo; done
