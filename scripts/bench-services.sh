#!/usr/bin/env bash
# Side-by-side benchmarks of issues 11 and 12: kvplane's coordinator and cache node against
# LMCache 0.5.6's Python services, in the same run, interleaved, a fresh server per
# measurement, then the median of every figure over the runs.
#
#   coordinator: `kvplane coordinator`  vs  `python -m lmcache.v1.mp_coordinator`
#                driven by `kvplane bench coordinator` (docs/BENCHMARKS.md)
#   node:        `kvplane node` (L1 only)  vs  `python -m lmcache.v1.server HOST PORT cpu`
#                vs the bare-loopback baseline, driven by `kvplane bench node`; kvplane
#                also with `--l1-preallocate` (the bytes the run stores, plus 0.25 GiB)
#   node-py:     `kvplane node` (as is: a thread per connection; with `--lm-connection-model tasks`;
#                with `--l1-preallocate`)
#                vs  LMCache's server,
#                driven by benches/lmcache/node_py_client.py: Python clients that frame
#                requests with LMCache's own protocol classes, as its LMCServerConnector does
#
# Usage: scripts/bench-services.sh [coordinator|node|node-py|all] [RUNS]      (default: all 3)
# Env:   KVPLANE_BIN      kvplane binary (default target/release/kvplane, built if missing)
#        SERVERS PHASE_SECONDS SENDERS BATCH TOKEN_IDS coordinator scenario (1000 10 4 100 0)
#        LMCACHE_FLEET_VENV  run LMCache's coordinator as `$LMCACHE_FLEET_VENV/bin/lmcache
#                         coordinator` from the real-torch venv (scripts/setup-mp-fleet.sh)
#                         instead of the stand-in-torch wrapper in the interop venv
#        CLIENTS BYTES_PER_SIZE SIZES           node scenario (4, 1 GiB, 262144,2097152)
#        PY_SIZE PY_BYTES_PER_CLIENT            node-py scenario (2 MiB, 256 MiB; CLIENTS clients)
#        MP_VENV          venv with lmcache 0.5.6 and torch for the Python client (.venv-mp)
#        WARM_GIB         GiB of memory touched and freed once before the first round (8): on a
#                         VM whose host backs guest memory lazily, the first touch of a guest
#                         page costs a host fault, so without this the first rounds are slower
#        OUT              directory for the raw JSON reports (default: a temp dir)
# Needs: the interop venv (scripts/setup-python.sh); this script adds the few wheels LMCache's
#        coordinator imports at startup (benches/lmcache/requirements.txt).
# Every server's RSS is read from /proc/PID/status (VmRSS, VmHWM) right after its run, and
# /proc/loadavg is recorded before and after each run: the machine is shared.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHAT="${1:-all}"
RUNS="${2:-3}"
BIN="${KVPLANE_BIN:-$ROOT/target/release/kvplane}"
VENV="${KVPLANE_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
OUT="${OUT:-$(mktemp -d /tmp/kvplane-bench-services.XXXXXX)}"
SERVERS="${SERVERS:-1000}"
SECONDS_PER_PHASE="${PHASE_SECONDS:-10}"
SENDERS="${SENDERS:-4}"
BATCH="${BATCH:-100}"
TOKEN_IDS="${TOKEN_IDS:-0}"
FLEET_VENV="${LMCACHE_FLEET_VENV:-}"
CLIENTS="${CLIENTS:-4}"
BYTES_PER_SIZE="${BYTES_PER_SIZE:-1073741824}"
SIZES="${SIZES:-262144,2097152}"
WARM_GIB="${WARM_GIB:-8}"
PY_SIZE="${PY_SIZE:-2097152}"
PY_BYTES_PER_CLIENT="${PY_BYTES_PER_CLIENT:-268435456}"
MP_PY="${MP_VENV:-$ROOT/.venv-mp}/bin/python"

log() { printf '[bench-services] %s\n' "$*" >&2; }

case "$WHAT" in coordinator | node | node-py | all) ;; *)
    echo "usage: $0 [coordinator|node|node-py|all] [RUNS]" >&2
    exit 2
    ;;
esac
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "RUNS must be a positive integer" >&2; exit 2; }

if [[ ! -x "$BIN" ]]; then
    log "building $BIN (release)"
    (cd "$ROOT" && cargo build --release --bin kvplane)
fi
bash "$ROOT/scripts/setup-python.sh" >&2
"$PY" -m pip install -q --no-deps --only-binary=:all: -r "$ROOT/benches/lmcache/requirements.txt" >&2
mkdir -p "$OUT"
log "raw reports in $OUT"

SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_tcp PORT: until something accepts on 127.0.0.1:PORT (60 s at most).
wait_tcp() {
    local i
    for i in $(seq 1 600); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        kill -0 "$SERVER_PID" 2>/dev/null || { log "server exited early"; return 1; }
        sleep 0.1
    done
    log "nothing listens on port $1 after 60 s"
    return 1
}

# start NAME CMD...: runs the server in the background, its log in $OUT/NAME.log.
start() {
    local name="$1"
    shift
    "$@" >"$OUT/$name.log" 2>&1 &
    SERVER_PID=$!
}

# stop LABEL: records the server's RSS and peak RSS, then stops it.
stop() {
    local status="/proc/$SERVER_PID/status"
    local rss hwm
    rss=$(awk '/^VmRSS:/ {print $2}' "$status" 2>/dev/null || echo 0)
    hwm=$(awk '/^VmHWM:/ {print $2}' "$status" 2>/dev/null || echo 0)
    echo "{\"vmrss_kib\": ${rss:-0}, \"vmhwm_kib\": ${hwm:-0}}" >"$OUT/$1.proc.json"
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

load() { cut -d' ' -f1-3 /proc/loadavg; }

# bench LABEL ARGS...: runs `kvplane bench ARGS --json` with the server's pid, saving the
# report and the load average around it.
bench() {
    local label="$1"
    shift
    local before after
    before=$(load)
    "$BIN" bench "$@" --json >"$OUT/$label.json"
    after=$(load)
    echo "{\"before\": \"$before\", \"after\": \"$after\"}" >"$OUT/$label.load.json"
    log "$label done (load $before -> $after)"
}

coordinator_round() {
    local r="$1" port
    port=$(free_port)
    start "coord-kvplane-$r" "$BIN" coordinator --host 127.0.0.1 --port "$port"
    wait_tcp "$port"
    bench "coord-kvplane-$r" coordinator --url "http://127.0.0.1:$port" --servers "$SERVERS" \
        --seconds "$SECONDS_PER_PHASE" --senders "$SENDERS" --batch "$BATCH" \
        --token-ids "$TOKEN_IDS" --pid "$SERVER_PID"
    stop "coord-kvplane-$r"

    port=$(free_port)
    # Metrics off: the OpenTelemetry SDK is not installed (this favours the Python side).
    if [[ -n "$FLEET_VENV" ]]; then
        start "coord-python-$r" env LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 \
            "$FLEET_VENV/bin/lmcache" coordinator --host 127.0.0.1 --port "$port" --disable-metrics
    else
        start "coord-python-$r" "$PY" "$ROOT/benches/lmcache/run_mp_coordinator.py" \
            --host 127.0.0.1 --port "$port" --disable-metrics
    fi
    wait_tcp "$port"
    bench "coord-python-$r" coordinator --url "http://127.0.0.1:$port" --servers "$SERVERS" \
        --seconds "$SECONDS_PER_PHASE" --senders "$SENDERS" --batch "$BATCH" \
        --token-ids "$TOKEN_IDS" --pid "$SERVER_PID"
    stop "coord-python-$r"
}

node_round() {
    local r="$1" port l1_gb pre_gb
    # L1 large enough that nothing is evicted: the stored bytes plus a margin.
    l1_gb=$("$PY" -c "print(($BYTES_PER_SIZE * len('$SIZES'.split(','))) / 2**30 * 1.5 + 1)")
    port=$(free_port)
    start "node-kvplane-$r" "$BIN" node --host 127.0.0.1 --port "$port" --no-http --l1-size-gb "$l1_gb"
    wait_tcp "$port"
    bench "node-kvplane-$r" node --addr "127.0.0.1:$port" --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES" --pid "$SERVER_PID" --seed "$r"
    bench "node-kvplane-rewrite-$r" node --addr "127.0.0.1:$port" --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES" --pid "$SERVER_PID" --seed "$r"
    stop "node-kvplane-$r"

    # Preallocated: what the run stores, plus a margin.
    pre_gb=$("$PY" -c "print(($BYTES_PER_SIZE * len('$SIZES'.split(','))) / 2**30 + 0.25)")
    port=$(free_port)
    start "node-kvplane-prealloc-$r" "$BIN" node --host 127.0.0.1 --port "$port" --no-http \
        --l1-size-gb "$l1_gb" --l1-preallocate "$pre_gb"
    wait_tcp "$port"
    bench "node-kvplane-prealloc-$r" node --addr "127.0.0.1:$port" --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES" --pid "$SERVER_PID" --seed "$r"
    stop "node-kvplane-prealloc-$r"

    port=$(free_port)
    start "node-python-$r" "$PY" "$ROOT/benches/lmcache/run_lmcache_server.py" 127.0.0.1 "$port" cpu
    wait_tcp "$port"
    bench "node-python-$r" node --addr "127.0.0.1:$port" --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES" --pid "$SERVER_PID" --seed "$r"
    bench "node-python-rewrite-$r" node --addr "127.0.0.1:$port" --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES" --pid "$SERVER_PID" --seed "$r"
    stop "node-python-$r"

    bench "node-baseline-$r" node --baseline --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES"
    bench "node-baseline-keep-$r" node --baseline-keep --clients "$CLIENTS" \
        --bytes-per-size "$BYTES_PER_SIZE" --sizes "$SIZES"
}

# pybench LABEL PORT: runs the Python client against 127.0.0.1:PORT, saving its report.
pybench() {
    local label="$1" port="$2" before after
    before=$(load)
    "$MP_PY" "$ROOT/benches/lmcache/node_py_client.py" 127.0.0.1 "$port" --clients "$CLIENTS" \
        --size "$PY_SIZE" --bytes-per-client "$PY_BYTES_PER_CLIENT" --seed "$r" \
        2>>"$OUT/$label.client.log" >"$OUT/$label.json"
    after=$(load)
    echo "{\"before\": \"$before\", \"after\": \"$after\"}" >"$OUT/$label.load.json"
    log "$label done (load $before -> $after)"
}

node_py_round() {
    local r="$1" port l1_gb pre_gb
    l1_gb=$("$PY" -c "print($PY_BYTES_PER_CLIENT * $CLIENTS / 2**30 * 1.5 + 1)")
    pre_gb=$("$PY" -c "print($PY_BYTES_PER_CLIENT * $CLIENTS / 2**30 + 0.25)")
    port=$(free_port)
    start "node-py-kvplane-$r" "$BIN" node --host 127.0.0.1 --port "$port" --no-http --l1-size-gb "$l1_gb"
    wait_tcp "$port"
    pybench "node-py-kvplane-$r" "$port"
    stop "node-py-kvplane-$r"

    port=$(free_port)
    start "node-py-kvplane-tasks-$r" "$BIN" node --host 127.0.0.1 --port "$port" --no-http \
        --l1-size-gb "$l1_gb" --lm-connection-model tasks
    wait_tcp "$port"
    pybench "node-py-kvplane-tasks-$r" "$port"
    stop "node-py-kvplane-tasks-$r"

    port=$(free_port)
    start "node-py-kvplane-prealloc-$r" "$BIN" node --host 127.0.0.1 --port "$port" --no-http \
        --l1-size-gb "$l1_gb" --l1-preallocate "$pre_gb"
    wait_tcp "$port"
    pybench "node-py-kvplane-prealloc-$r" "$port"
    stop "node-py-kvplane-prealloc-$r"

    port=$(free_port)
    start "node-py-python-$r" "$PY" "$ROOT/benches/lmcache/run_lmcache_server.py" 127.0.0.1 "$port" cpu
    wait_tcp "$port"
    pybench "node-py-python-$r" "$port"
    stop "node-py-python-$r"
}

if [[ "$WHAT" == node* || "$WHAT" == all ]] && [[ "$WARM_GIB" != 0 ]]; then
    log "touching and freeing $WARM_GIB GiB once (see WARM_GIB above)"
    "$PY" -c "import mmap; m = mmap.mmap(-1, $WARM_GIB << 30); m.madvise(23); m.close()"
fi

for r in $(seq 1 "$RUNS"); do
    log "round $r of $RUNS"
    if [[ "$WHAT" == coordinator || "$WHAT" == all ]]; then coordinator_round "$r"; fi
    if [[ "$WHAT" == node || "$WHAT" == all ]]; then node_round "$r"; fi
    if [[ "$WHAT" == node-py || "$WHAT" == all ]]; then node_py_round "$r"; fi
done

"$PY" "$ROOT/benches/lmcache/summarize.py" "$OUT" "$WHAT" "$RUNS"
