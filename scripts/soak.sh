#!/usr/bin/env bash
# Soak: resident-memory ceilings, then N minutes of mixed load against a release kvplane on
# loopback, sampling the controller's RSS, open fds, threads and tokio tasks to a CSV. Not
# part of CI: resident memory depends on the build, the allocator and the machine, so the
# test suite asserts none; these ceilings are where it is held.
#
#   scripts/soak.sh                          # ceilings, then 10 minutes; output in /tmp/kvplane-soak/
#   SOAK_SECONDS=120 SOAK_DIR=/tmp/s scripts/soak.sh
#   SOAK_PHASES=ceilings scripts/soak.sh     # only the ceilings (a few minutes)
#
# Ceilings, each against a fresh release `kvplane serve` (the run fails if one is exceeded):
#   * bad-token bodies: a 5 MB `/lookup` of invalid tokens and three of 262,143 (defaults),
#     then three 5 MB ones with --max-body-bytes 8 MiB: each answered small (413 / 422), peak
#     RSS (VmHWM) under 200 MiB (the release that preceded the limits peaked at 1.6 GB);
#   * idle frame claims: 200 PUSH peers on the PULL socket, each announcing a 60 MiB frame
#     and sending none of it: RSS grows by at most 6 MiB (memory follows the bytes received);
#   * register/deregister churn: `kvplane bench --scenarios churn`, 1,000 warm-up cycles then
#     six rounds of 10,000 (register, 10 admits, deregister, over 8 connections): RSS after
#     round 6 within 12 MiB of round 3 (a leak of ~420 bytes per cycle or more exceeds it).
#
# Load, all at once:
#   * ingest and P2P lookups: `kvplane bench --scenarios ingest,lookup` in a loop (10 workers,
#     2M ops in 50-op batches as fast as the controller applies them, then 20,000 lookups of
#     100 hashes; each run registers and deregisters its workers: churn);
#   * a simulated fleet (examples/worker_sim): 8 instances × 2 workers, heartbeats every
#     second, P2P lookups, a worker leaving and rejoining every ~10 s;
#   * HTTP: POST /lookup and GET /controller/workers every 200 ms;
#   * heartbeats: `kvplane bench --scenarios heartbeat` (200 workers, 1/s) in a loop.
# Liveness sweeps run (interval 2 s, timeout 8 s) and reap any worker a load generator leaves
# behind; bench runs are spaced by SOAK_BENCH_GAP seconds (12) so that such reaping finishes
# before the next run measures its baseline key count (the recorded soak predates the bench
# fix that waits for its own deregistrations).
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${SOAK_SECONDS:-600}"
interval="${SOAK_SAMPLE_SECONDS:-5}"
dir="${SOAK_DIR:-/tmp/kvplane-soak}"
http_port="${SOAK_HTTP_PORT:-19900}"
pull_port="${SOAK_PULL_PORT:-19300}"
reply_port="${SOAK_REPLY_PORT:-19400}"
hb_port="${SOAK_HEARTBEAT_PORT:-19082}"
phases="${SOAK_PHASES:-ceilings,load}"
mkdir -p "$dir"
rm -f "$dir"/*.log "$dir"/samples.csv "$dir"/ceilings.txt

echo "== building release binaries"
cargo build --release --quiet --bin kvplane --example worker_sim
bin=target/release/kvplane
sim=target/release/examples/worker_sim

failed=0
if [[ ",$phases," == *",ceilings,"* ]]; then
    bash scripts/soak-ceilings.sh "$bin" "$dir" | tee "$dir/ceilings.txt" || failed=1
fi
if [[ ",$phases," != *",load,"* ]]; then
    exit $failed
fi

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

KVPLANE_SERVE_HOST=127.0.0.1 KVPLANE_SERVE_PORT=$http_port \
KVPLANE_SERVE_MONITOR_PORTS="{\"pull\": $pull_port, \"reply\": $reply_port, \"heartbeat\": $hb_port}" \
KVPLANE_SERVE_HEALTH_CHECK_INTERVAL=2 KVPLANE_SERVE_LMCACHE_WORKER_TIMEOUT=8 RUST_LOG=warn \
    "$bin" serve >"$dir/kvplane.log" 2>&1 &
kv=$!
pids+=("$kv")
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null || { echo "kvplane did not start"; exit 1; }
echo "== kvplane pid $kv on 127.0.0.1:$http_port (PULL $pull_port, ROUTER $reply_port, heartbeat $hb_port)"

metric() { # name → value (sum over label sets) from /metrics
    curl -sf "http://127.0.0.1:$http_port/metrics" | awk -v n="$1" '
        $1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f", s }'
}
sample() {
    local t rss fds threads tasks workers keys ops dropped
    t=$(date +%s)
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$kv/status")
    threads=$(awk '/^Threads:/ {print $2}' "/proc/$kv/status")
    fds=$(ls "/proc/$kv/fd" | wc -l)
    local text
    text=$(curl -sf "http://127.0.0.1:$http_port/metrics" || true)
    tasks=$(awk '$1 == "kvplane_tasks" {print $2}' <<<"$text")
    workers=$(awk '$1 == "kvplane_workers" {print $2}' <<<"$text")
    keys=$(awk 'index($1, "lmcache:cache_controller_kv_pool_keys_count") == 1 {printf "%.0f", $NF}' <<<"$text")
    ops=$(awk 'index($1, "kvplane_kv_ops_applied_total") == 1 {s += $NF} END {printf "%.0f", s}' <<<"$text")
    dropped=$(awk 'index($1, "kvplane_frames_dropped_total") == 1 {s += $NF} END {printf "%.0f", s}' <<<"$text")
    echo "$t,$rss,$fds,$threads,$tasks,$workers,$keys,$ops,$dropped" >>"$dir/samples.csv"
}
echo "unix_time,rss_kib,fds,threads,tasks,workers,keys,ops_applied,frames_dropped" >"$dir/samples.csv"
sample
start=$(date +%s)
end=$((start + seconds))

common=(--pull "127.0.0.1:$pull_port" --reply "127.0.0.1:$reply_port"
        --http "http://127.0.0.1:$http_port" --timeout 120)
gap="${SOAK_BENCH_GAP:-12}"
loop() { # name, command… : rerun until the deadline, appending to name.log
    local name=$1; shift
    (while [ "$(date +%s)" -lt "$end" ]; do
        "$@" >>"$dir/$name.log" 2>&1 || echo "run failed: $?" >>"$dir/$name.log"
        sleep "$gap"
    done) &
    pids+=("$!")
}
# Ingest and lookup runs take turns in one loop: each waits for the total key count to reach
# its target, so a concurrent run's deregistration would stall the other.
loop bench "$bin" bench "${common[@]}" --scenarios ingest,lookup --workers 10 --ops 2000000 \
    --lookup-keys 100000 --lookup-requests 20000
loop heartbeat "$bin" bench "${common[@]}" --scenarios heartbeat \
    --heartbeat-workers 200 --heartbeat-seconds 30
"$sim" --pull "127.0.0.1:$pull_port" --reply "127.0.0.1:$reply_port" --instances 8 --workers 2 \
    --seconds "$seconds" --ops-per-sec 500 --heartbeat-secs 1 --churn-secs 10 \
    >"$dir/worker_sim.log" 2>&1 &
pids+=("$!")
(while [ "$(date +%s)" -lt "$end" ]; do
    curl -sf -X POST "http://127.0.0.1:$http_port/lookup" \
        -d "{\"tokens\": [$(seq -s, 1 600)]}" >/dev/null || echo "lookup failed" >>"$dir/http.log"
    curl -sf "http://127.0.0.1:$http_port/controller/workers" >/dev/null || echo "workers failed" >>"$dir/http.log"
    sleep 0.2
done) &
pids+=("$!")

echo "== load running for ${seconds}s; samples every ${interval}s to $dir/samples.csv"
while [ "$(date +%s)" -lt "$end" ]; do
    sleep "$interval"
    sample
    kill -0 "$kv" 2>/dev/null || { echo "kvplane died"; exit 1; }
done
load_rows=$(($(wc -l <"$dir/samples.csv") - 1))
echo "== load stopped; draining (until no worker is left, at most 120 s)"
for p in "${pids[@]:1}"; do wait "$p" 2>/dev/null || true; done
for _ in $(seq 24); do
    sleep 5
    sample
    [ "$(tail -1 "$dir/samples.csv" | cut -d, -f6)" = 0 ] && break
done

python3 - "$dir/samples.csv" "$load_rows" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
load_end = int(sys.argv[2]) - 1
def col(name):
    return [float(r[name]) for r in rows if r[name] not in ("", None)]
print(f"{len(rows)} samples over {int(rows[-1]['unix_time']) - int(rows[0]['unix_time'])} s")
for name in ("rss_kib", "fds", "threads", "tasks", "workers", "keys"):
    v = col(name)
    if v:
        print(f"{name:>8}: start {v[0]:.0f}  first under load {v[1]:.0f}  end of load {v[load_end]:.0f}"
              f"  max {max(v):.0f}  after drain {v[-1]:.0f}")
ops = col("ops_applied")
print(f"ops applied: {ops[-1]:.0f} ({ops[-1] / max(1, int(rows[-1]['unix_time']) - int(rows[0]['unix_time'])):.0f}/s average)")
print(f"frames dropped: {col('frames_dropped')[-1]:.0f}")
EOF
echo "== ingest runs (ops/s applied):"
grep -h '^ingest' "$dir/bench.log" | awk '{print $2}' | sort -n | awk '
    {v[NR] = $1} END { if (NR) printf "   %d runs, min %.0f, median %.0f, max %.0f\n", NR, v[1], v[int((NR + 1) / 2)], v[NR] }'
echo "== lookup runs:"; grep -h '^lookup' "$dir/bench.log" | tail -3
echo "== heartbeat runs:"; grep -h '^heartbeat' "$dir/heartbeat.log" | tail -3
echo "== failed load runs:"; grep -h "run failed\|lookup failed\|workers failed" "$dir"/*.log | sort | uniq -c || echo "   none"
grep -h "^Error" "$dir/bench.log" | sort | uniq -c || true
echo "== kvplane warnings: $(grep -c WARN "$dir/kvplane.log" || true) lines (see $dir/kvplane.log)"
if [ $failed -ne 0 ]; then
    echo "== a resident-memory ceiling was exceeded (see $dir/ceilings.txt)"
fi
exit $failed
