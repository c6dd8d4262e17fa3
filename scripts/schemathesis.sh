#!/usr/bin/env bash
# schemathesis (PyPI) against every kvplane service's /openapi.json, each on 127.0.0.1 with free
# ports and a token on every class (--api-token, --api-token-reads, --api-token-peers), bounded
# for CI.
#
#   scripts/schemathesis.sh                          # every service
#   scripts/schemathesis.sh coordinator node         # some of them
#   SCHEMATHESIS_MAX_EXAMPLES=200 scripts/schemathesis.sh   # every service, 200 examples
#
# Services: controller (`kvplane serve`, with two fake workers: one answers every command, one
# never does), indexer, coordinator (no MP server registered: prefetches to one are 404/502),
# node, router (its one engine is down: the proxied routes answer their documented 502/503).
# What must hold on each:
#   * the token rule read from the document itself: every operation whose `x-kvplane-access`
#     class needs the token declares `security` and is 401 without the token, with a wrong one
#     and with it sent as Basic; with it, never 401; `open` operations are never 401;
#   * schemathesis with every check (`--checks all`): no 5xx except documented ones, every
#     answer's status, content type and body as the document says;
#   * the service is still alive and healthy afterwards, and its own per-route metrics show no
#     5xx but the ones its document allows.
# Installs schemathesis into .venv-schemathesis (pinned in tests/schemathesis/requirements.txt).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
venv="${SCHEMATHESIS_VENV:-$root/.venv-schemathesis}"
out="${SCHEMATHESIS_DIR:-$root/target/schemathesis}"
token="schemathesis-token"
mkdir -p "$out"

if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "== installing schemathesis into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r tests/schemathesis/requirements.txt
fi
py="$venv/bin/python"

echo "== building kvplane and the fake workers"
cargo build --quiet --bin kvplane --example fake_workers

# N free TCP ports on 127.0.0.1.
free_ports() {
    "$py" -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
auth="Authorization: Bearer $token"
tokens=(--api-token "$token" --api-token-reads --api-token-peers)

# Waits until $base/readyz answers 200.
wait_ready() {
    for _ in $(seq 200); do
        curl -sf "$base${ready_path:-/readyz}" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "   $name did not become ready:"; tail -20 "$log"; return 1
}

# Each start_<service> starts one service and sets base, pid, log, examples (per operation)
# and allow5xx (the 5xx its document allows: `status_code_conformance` still fails any an
# operation does not list).

start_controller() {
    local ports; ports=($(free_ports 4))
    base="http://127.0.0.1:${ports[0]}"; log="$out/controller.log"; examples=50; allow5xx="504"
    RUST_LOG=warn target/debug/kvplane serve --host 127.0.0.1 --port "${ports[0]}" \
        --monitor-ports "{\"pull\": ${ports[1]}, \"reply\": ${ports[2]}, \"heartbeat\": ${ports[3]}}" \
        --downlink-timeout 1 --health-check-interval -1 \
        --api-token "$token" --api-token-reads >"$log" 2>&1 &
    pid=$!; pids+=("$pid")
    wait_ready
    # Fake workers: instance "" answers every command, instance "0" never does (504 after 1 s).
    target/debug/examples/fake_workers --reply "127.0.0.1:${ports[2]}" \
        >"$out/workers.log" 2>&1 &
    pids+=("$!")
    local workers=0
    for _ in $(seq 100); do
        workers=$(curl -sf -H "$auth" "$base/controller/key-stats" |
            "$py" -c 'import json,sys; print(json.load(sys.stdin)["total_worker_count"])')
        [ "$workers" = 2 ] && break
        sleep 0.1
    done
    [ "$workers" = 2 ] || { echo "fake workers did not register:"; cat "$out/workers.log"; return 1; }
}

start_indexer() {
    local port; port=$(free_ports 1)
    base="http://127.0.0.1:$port"; log="$out/indexer.log"; examples=50; allow5xx=""
    RUST_LOG=warn target/debug/kvplane indexer --host 127.0.0.1 --port "$port" \
        --replay-timeout-ms 500 "${tokens[@]}" >"$log" 2>&1 &
    pid=$!; pids+=("$pid")
    wait_ready
}

start_coordinator() {
    local port; port=$(free_ports 1)
    base="http://127.0.0.1:$port"; log="$out/coordinator.log"; examples=30; allow5xx="502"
    RUST_LOG=warn target/debug/kvplane coordinator --host 127.0.0.1 --port "$port" \
        --enable-startup-resync false --enable-blend-lookup "${tokens[@]}" >"$log" 2>&1 &
    pid=$!; pids+=("$pid")
    wait_ready
}

start_node() {
    local ports; ports=($(free_ports 2))
    base="http://127.0.0.1:${ports[1]}"; log="$out/node.log"; examples=50; allow5xx="503"
    RUST_LOG=warn target/debug/kvplane node --host 127.0.0.1 --port "${ports[0]}" \
        --http-port "${ports[1]}" --l1-size-gb 0.1 "${tokens[@]}" >"$log" 2>&1 &
    pid=$!; pids+=("$pid")
    wait_ready
}

# The token rule on every operation of $base/openapi.json, by its `x-kvplane-access`.
# The router in front of one engine that is down: every proxied request ends in the router's
# own documented 502/503 (no engine could take it), so what is tested is the router's own
# reading of the bodies, its errors, its token rule and that nothing it is sent hurts it.
start_router() {
    local ports; ports=($(free_ports 2))
    base="http://127.0.0.1:${ports[0]}"; log="$out/router.log"; examples=30; allow5xx="502|503"
    RUST_LOG=warn target/debug/kvplane router --host 127.0.0.1 --port "${ports[0]}" \
        --engine "http://127.0.0.1:${ports[1]},instance=down" --model schemathesis-model \
        --connect-timeout 1 --response-timeout 5 --health-interval 1 "${tokens[@]}" >"$log" 2>&1 &
    pid=$!; pids+=("$pid")
    ready_path=/healthz wait_ready   # /readyz is 503 by design: its engine is down
}

token_sweep() {
    "$py" - "$base" "$token" <<'EOF'
import json, sys, urllib.request, urllib.error
base, token = sys.argv[1], sys.argv[2]
doc = json.load(urllib.request.urlopen(base + "/openapi.json"))
NEEDS_TOKEN = {"read", "write", "peer"}  # with --api-token-reads and --api-token-peers
def call(method, path, auth):
    path = "/".join("x" if seg.startswith("{") else seg for seg in path.split("/"))
    body = None if method in ("get", "head") else b"{}"
    req = urllib.request.Request(base + path, method=method.upper(), data=body)
    if body is not None:
        # A JSON body, so the same-origin guard (415 for non-JSON) lets the request reach auth.
        req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", auth)
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
bad, classes = [], {}
for path, ops in doc["paths"].items():
    for method, op in ops.items():
        name = f"{method.upper()} {path}"
        access = op.get("x-kvplane-access")
        if access not in NEEDS_TOKEN | {"open"}:
            bad.append(f"{name}: x-kvplane-access {access!r}")
            continue
        classes[access] = classes.get(access, 0) + 1
        guarded = access in NEEDS_TOKEN
        if guarded != ("security" in op) or guarded != ("401" in op.get("responses", {})):
            bad.append(f"{name} ({access}): security or its 401 answer missing or extra")
        for auth in (None, "Bearer wrong", "Basic " + token):
            s = call(method, path, auth)
            if guarded and s != 401:
                bad.append(f"{name} ({access}) with {auth!r}: {s}, expected 401")
            if not guarded and s == 401:
                bad.append(f"{name} with {auth!r}: 401 on an open route")
        if call(method, path, "Bearer " + token) == 401:
            bad.append(f"{name} with the token: 401")
print(f"   {sum(classes.values())} operations by class: "
      + ", ".join(f"{c} {n}" for c, n in sorted(classes.items())))
for b in bad:
    print("   FAIL", b)
sys.exit(1 if bad else 0)
EOF
}

# Every check of schemathesis against $base, on every service; its own config file when the
# service has one. Every document's schemas and its service's validators are one rule
# (docs/RELIABILITY.md, "One rule per route"), so the checks that hold a document to the
# validator's exact boundaries (positive_data_acceptance, negative_data_rejection) run too. One
# worker: with two, hypothesis' lambda descriptions race in CPython 3.11's ast.parse
# ("AST constructor recursion depth mismatch", a runtime error of the tool, not of kvplane).
run_schemathesis() {
    local config=tests/schemathesis/schemathesis.toml
    [ -f "tests/schemathesis/$name.toml" ] && config="tests/schemathesis/$name.toml"
    local started=$SECONDS
    "$venv/bin/schemathesis" --config-file "$config" \
        run "$base/openapi.json" \
        --checks all \
        --max-examples "$examples" \
        --phases examples,coverage,fuzzing \
        --header "$auth" \
        --seed 20261122 \
        --generation-database none \
        --workers 1 \
        --request-timeout 10 \
        --no-color \
        --report junit --report-dir "$out/$name" \
        >"$out/$name.txt" 2>&1
    local rc=$?
    tail -25 "$out/$name.txt" | sed 's/^/   /'
    echo "   ($((SECONDS - started)) s, $examples examples per operation)"
    return $rc
}

# Alive, healthy, and no 5xx in its own metrics but $allow5xx (and /readyz's 503).
after_run() {
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "   FAIL: $name died"; return 1
    fi
    if ! curl -sf "$base/healthz" >/dev/null; then
        echo "   FAIL: /healthz does not answer"; return 1
    fi
    local metrics; metrics=$(curl -sf -H "$auth" "$base/metrics")
    echo "$metrics" | awk '/^[a-z_]*http_requests_total\{/ {
            match($0, /status="[0-9]+"/); s = substr($0, RSTART + 8, 3); n[s] += $NF; t += $NF }
        END { printf "   alive; %d requests answered, by status:", t; for (s in n) printf " %s×%d", s, n[s]; print "" }'
    local five; five=$(echo "$metrics" | awk '/^[a-z_]*http_requests_total\{/ && /status="5/' |
        grep -v 'route="/readyz"' || true)
    [ -n "$allow5xx" ] && five=$(echo "$five" | grep -Ev "status=\"($allow5xx)\"" || true)
    if [ -n "$five" ]; then
        echo "   FAIL: 5xx its document does not allow:"; echo "$five" | sed 's/^/   /'; return 1
    fi
    if grep -E "panicked|ERROR" "$log"; then
        echo "   FAIL: errors in the log"; return 1
    fi
}

services=("$@")
[ ${#services[@]} -gt 0 ] || services=(controller indexer coordinator node router)
status=0
failed=()
for name in "${services[@]}"; do
    echo "== $name"
    ok=1
    "start_$name" || ok=0
    if [ $ok = 1 ]; then
        [ -n "${SCHEMATHESIS_MAX_EXAMPLES:-}" ] && examples=$SCHEMATHESIS_MAX_EXAMPLES
        echo "-- the token rule on every operation of its /openapi.json"
        token_sweep || ok=0
        echo "-- schemathesis"
        run_schemathesis || ok=0
        echo "-- $name after the run"
        after_run || ok=0
    fi
    kill "$pid" 2>/dev/null || true
    [ $ok = 1 ] || { status=1; failed+=("$name"); }
done
if [ $status -eq 0 ]; then
    echo "== schemathesis: OK (${services[*]})"
else
    echo "== schemathesis: FAILED: ${failed[*]} (details in $out/)"
fi
exit $status
