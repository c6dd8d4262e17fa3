#!/usr/bin/env bash
# Side-by-side benchmark of issue 10: `kvplane indexer` against Dynamo's standalone indexer
# (`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1, CPU only), fed the same pre-encoded
# vLLM 0.33 KV-event stream over ZMQ by `kvplane bench indexer`, interleaved, a fresh server per
# measurement, then the median of every figure over the runs (docs/BENCHMARKS.md).
#
# Usage: scripts/bench-indexer.sh [RUNS]                                  (default 3)
# Env:   KVPLANE_BIN     kvplane binary (default target/release/kvplane, built if missing)
#        BLOCKS          blocks published per run (default 1048576)
#        INSTANCES       simulated engines (default 4)
#        QUERIES         timed /query calls (default 2000)
#        DYNAMO_THREADS  --threads of dynamo.indexer (default: its own default, 4)
#        OUT             directory for the raw JSON reports and logs (default: a temp dir)
# Needs: Python 3.11 with pip; the Dynamo venv is built once under target/dynamo-bench from
#        benches/dynamo/requirements.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-3}"
BIN="${KVPLANE_BIN:-$ROOT/target/release/kvplane}"
BLOCKS="${BLOCKS:-1048576}"
INSTANCES="${INSTANCES:-4}"
QUERIES="${QUERIES:-2000}"
OUT="${OUT:-$(mktemp -d /tmp/kvplane-bench-indexer.XXXXXX)}"
VENV="$ROOT/target/dynamo-bench/venv"
REQ="$ROOT/benches/dynamo/requirements.txt"
log() { printf '[bench-indexer] %s\n' "$*" >&2; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "RUNS must be a positive integer" >&2; exit 2; }

if [[ ! -x "$BIN" ]]; then
    log "building $BIN (release)"
    (cd "$ROOT" && cargo build --release --bin kvplane)
fi
WANT="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" || "$(cat "$VENV/.stamp" 2>/dev/null)" != "$WANT" ]]; then
    log "building the Dynamo venv in $VENV"
    rm -rf "$VENV"
    "${PYTHON:-python3.11}" -m venv "$VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install -q --no-input --no-deps \
        --only-binary=:all: -r "$REQ"
    echo "$WANT" >"$VENV/.stamp"
fi
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

free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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

# one FLAVOR LABEL CMD...: starts the server (CMD gets --port appended), benches it, stops it.
one() {
    local flavor="$1" label="$2" port
    shift 2
    port=$(free_port)
    "$@" --port "$port" >"$OUT/$label.log" 2>&1 &
    SERVER_PID=$!
    wait_tcp "$port"
    "$BIN" bench indexer --flavor "$flavor" --url "http://127.0.0.1:$port" --blocks "$BLOCKS" \
        --instances "$INSTANCES" --queries "$QUERIES" --pid "$SERVER_PID" --json >"$OUT/indexer-$label.json"
    log "$label: $(tr -d '\n ' <"$OUT/indexer-$label.json" | grep -o '"applied_events_per_sec":[0-9.]*')"
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

DYN=("$VENV/bin/python" -m dynamo.indexer)
[[ -n "${DYNAMO_THREADS:-}" ]] && DYN+=(--threads "$DYNAMO_THREADS")
for r in $(seq 1 "$RUNS"); do
    log "round $r of $RUNS (load $(cut -d' ' -f1-3 /proc/loadavg))"
    one kvplane "kvplane-$r" "$BIN" indexer --host 127.0.0.1
    one dynamo "dynamo-$r" "${DYN[@]}"
done
"$VENV/bin/python" "$ROOT/benches/dynamo/summarize.py" "$OUT"
