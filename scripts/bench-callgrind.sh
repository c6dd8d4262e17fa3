#!/usr/bin/env bash
# Instructions one kvplane service process executes for a fixed workload, counted by callgrind:
# repeatable whatever else the machine is doing (wall-clock figures on a shared 2-core machine
# are not). Use it to compare two builds: run it for each server binary with the same BENCH_BIN
# and compare the totals.
#
#   scripts/bench-callgrind.sh [SERVICE] SERVER_BIN [BENCH_BIN]
#
# SERVICE is controller (the default, so `bench-callgrind.sh SERVER_BIN` works as before),
# indexer, coordinator or node. SERVER_BIN runs under valgrind; BENCH_BIN (default SERVER_BIN)
# drives it with `kvplane bench`, outside valgrind, and must know the flags below (the
# coordinator's --event-batches came with this script). Every workload is a fixed amount of
# work, every answer the bench can check is checked (the script fails on a wrong one), and
# each takes a few minutes under valgrind. Everything on 127.0.0.1, on free ports.
#
# controller  `kvplane serve`: 200,000 admit/evict ops from 10 simulated workers (batches of
#             50, 20% evicts) on PULL, then 2,000 P2P lookups of 100 hashes over 100,000
#             indexed keys on the reply ROUTER; wrong_answers must be 0.
# indexer     `kvplane indexer`: 4 simulated vLLM engines (ZMQ PUB + replay ROUTER) publish
#             65,536 blocks (512 prompts of 128 blocks, 16 blocks per BlockStored) in vLLM
#             0.33's msgpack format, then 2,000 POST /query of a stored 128-block prompt;
#             wrong_answers must be 0.
# coordinator `kvplane coordinator`: 100 MP servers register and heartbeat once a second for
#             2 × 5 s (1,000 heartbeats), while in the second phase 4 of them post 250 event
#             batches each of 100 stored keys (100,000 events); the bench waits until
#             GET /quota shows every key applied.
# node        `kvplane node` (L1 only, 1 GiB): 4 clients PUT then GET 256 MiB of 256 KiB objects
#             and 256 MiB of 2 MiB objects over lm:// (seed 1); every GET's length and first
#             and last 4 KiB are checked.
# router      no load generator exists yet (`kvplane bench route` is not built): refused.
#
# Needs valgrind and python3. Prints the bench's check line and the callgrind total;
# CALLGRIND_KEEP=FILE keeps the profile for callgrind_annotate.
set -euo pipefail

usage="usage: scripts/bench-callgrind.sh [controller|indexer|coordinator|node] SERVER_BIN [BENCH_BIN]"
case "${1:-}" in
controller | indexer | coordinator | node)
    service=$1
    shift
    ;;
router)
    echo "router: there is no load generator for the router yet (kvplane bench route is not built)" >&2
    exit 2
    ;;
*) service=controller ;;
esac
server=${1:?$usage}
client=${2:-$server}
for bin in "$server" "$client"; do
    [[ -x "$bin" ]] || { echo "not an executable: $bin ($usage)" >&2; exit 2; }
done

out=$(mktemp -d)
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null || true; fi
    # CALLGRIND_KEEP=FILE keeps the profile (for callgrind_annotate).
    if [[ -n "${CALLGRIND_KEEP:-}" && -f "$out/cg" ]]; then cp "$out/cg" "$CALLGRIND_KEEP"; fi
    rm -rf "$out"
}
trap cleanup EXIT

# free_ports N: N distinct free TCP ports on 127.0.0.1.
free_ports() {
    python3 -c 'import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}

# serve ARGS...: starts SERVER_BIN ARGS under callgrind.
serve() {
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$server" "$@" >"$out/server.log" 2>&1 &
    pid=$!
}

# wait_tcp PORT: until the server accepts on PORT (valgrind starts slowly: 120 s at most).
wait_tcp() {
    local i
    for i in $(seq 1 1200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "the server exited early:" >&2
            tail -20 "$out/server.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "nothing listens on port $1 after 120 s" >&2
    exit 1
}

# bench ARGS...: `BENCH_BIN bench ARGS --json` into $out/report.json.
bench() {
    if ! "$client" bench "$@" --json >"$out/report.json"; then
        echo "the bench failed; server log:" >&2
        tail -20 "$out/server.log" >&2
        exit 1
    fi
}

case "$service" in
controller)
    read -r http pull reply hb < <(free_ports 4)
    serve serve --host 127.0.0.1 --port "$http" \
        --monitor-ports "{\"pull\":$pull,\"reply\":$reply,\"heartbeat\":$hb}"
    wait_tcp "$http"
    wait_tcp "$reply"
    bench --pull "127.0.0.1:$pull" --reply "127.0.0.1:$reply" --http "http://127.0.0.1:$http" \
        --timeout 900 --scenarios ingest,lookup --workers 10 --ops 200000 \
        --lookup-keys 100000 --lookup-requests 2000
    ;;
indexer)
    read -r http < <(free_ports 1)
    serve indexer --host 127.0.0.1 --port "$http"
    wait_tcp "$http"
    bench indexer --url "http://127.0.0.1:$http" --timeout 900 --instances 4 --blocks 65536 \
        --prompt-blocks 128 --blocks-per-event 16 --queries 2000
    ;;
coordinator)
    read -r http < <(free_ports 1)
    serve coordinator --host 127.0.0.1 --port "$http"
    wait_tcp "$http"
    bench coordinator --url "http://127.0.0.1:$http" --timeout 900 --servers 100 --seconds 5 \
        --senders 4 --batch 100 --event-batches 250
    ;;
node)
    read -r port < <(free_ports 1)
    serve node --host 127.0.0.1 --port "$port" --no-http --l1-size-gb 1
    wait_tcp "$port"
    bench node --addr "127.0.0.1:$port" --timeout 900 --clients 4 --sizes 262144,2097152 \
        --bytes-per-size 268435456 --seed 1
    ;;
esac
kill -TERM "$pid"
wait "$pid" || true
pid=""

python3 - "$service" "$out/report.json" <<'PY'
import json, sys
service, r = sys.argv[1], json.load(open(sys.argv[2]))
if service == "controller":
    ok = r["lookup"]["wrong_answers"] == 0 and r["lookup"]["latency"]["count"] == 2000
    line = (f"net keys {r['ingest']['net_keys']}, lookups {r['lookup']['latency']['count']}, "
            f"wrong answers {r['lookup']['wrong_answers']}")
elif service == "indexer":
    ok = r["wrong_answers"] == 0 and r["query"]["count"] == 2000 and r["blocks"] == 65536
    gaps = r.get("kvplane_gaps_replays_waits")
    line = (f"blocks {r['blocks']}, events {r['events']}, applied polls {r['applied_polls']}, "
            f"queries {r['query']['count']}, wrong answers {r['wrong_answers']}, "
            f"gaps/replays/queue-full waits {gaps}")
elif service == "coordinator":
    beats = (r["heartbeat_idle"]["count"], r["heartbeat_loaded"]["count"])
    ok = r["events"] == 4 * 250 * 100 and beats == (500, 500) and r["event_request"]["count"] == 1000
    line = f"events applied {r['events']}, event requests {r['event_request']['count']}, heartbeats {beats[0]} + {beats[1]}"
else:
    ops = [(s["size"], s["put"]["ops"], s["get"]["ops"]) for s in r["sizes"]]
    ok = ops == [(262144, 1024, 1024), (2097152, 128, 128)]
    line = "objects (size, PUT, GET checked) " + ", ".join(f"({a}, {b}, {c})" for a, b, c in ops)
print(line)
if not ok:
    sys.exit(f"{service}: the workload did not run as fixed (see above)")
PY
grep -E '^totals:' "$out/cg" | sed 's/^totals:/instructions (server process, all threads):/'
