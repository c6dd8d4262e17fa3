#!/usr/bin/env bash
# Instructions one `kvplane serve` process executes for a fixed workload, counted by callgrind:
# repeatable whatever else the machine is doing (wall-clock figures on a shared 2-core machine
# are not). Use it to compare two builds: run it for each binary and compare the totals.
#
#   scripts/bench-callgrind.sh SERVER_BIN [BENCH_BIN]     # BENCH_BIN defaults to SERVER_BIN
#
# Workload: 200,000 admit/evict ops from 10 simulated workers (batches of 50, 20% evicts), then
# 2,000 P2P lookups of 100 hashes over 100,000 indexed keys; every lookup answer is checked by
# the bench (wrong_answers must be 0). Needs valgrind. Everything on 127.0.0.1.
set -euo pipefail
server=${1:?usage: scripts/bench-callgrind.sh SERVER_BIN [BENCH_BIN]}
client=${2:-$server}
out=$(mktemp -d)
http=19950; pull=19851; reply=19852; hb=19853
valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$server" serve --host 127.0.0.1 \
  --port $http --monitor-ports "{\"pull\":$pull,\"reply\":$reply,\"heartbeat\":$hb}" \
  >"$out/server.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf -o /dev/null "http://127.0.0.1:$http/controller/key-stats" && break
  sleep 0.2
done
"$client" bench --pull 127.0.0.1:$pull --reply 127.0.0.1:$reply --http "http://127.0.0.1:$http" \
  --timeout 900 --json --scenarios ingest,lookup --workers 10 --ops 200000 \
  --lookup-keys 100000 --lookup-requests 2000 >"$out/report.json"
kill -TERM "$pid"; wait "$pid" || true
trap - EXIT
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"net keys {r['ingest']['net_keys']}, lookups {r['lookup']['latency']['count']}, wrong answers {r['lookup']['wrong_answers']}")
PY
grep -E '^totals:' "$out/cg" | sed 's/^totals:/instructions (server process, all threads):/'
rm -rf "$out"
