#!/usr/bin/env bash
# schemathesis (PyPI) against kvplane's /openapi.json, server on 127.0.0.1, bounded for CI.
#
#   scripts/schemathesis.sh                      # 50 examples per operation
#   SCHEMATHESIS_MAX_EXAMPLES=200 scripts/schemathesis.sh
#
# What must hold:
#   * no 5xx except the documented ones: schemathesis' `not_a_server_error` plus the schema
#     conformance checks (status codes, content types, response schemas), with two fake
#     workers registered: one that answers every command and one that never does (504);
#   * the --api-token rule: every mutating route is 401 without the token and with a wrong
#     one (schemathesis' `ignored_auth`, and an explicit sweep below); reads stay open;
#   * kvplane is still alive and healthy afterwards.
# Installs schemathesis into .venv-schemathesis (pinned in tests/schemathesis/requirements.txt).
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
venv="${SCHEMATHESIS_VENV:-$root/.venv-schemathesis}"
examples="${SCHEMATHESIS_MAX_EXAMPLES:-50}"
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
ports=($("$py" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
))
http_port=${ports[0]}
base="http://127.0.0.1:$http_port"

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

KVPLANE_HOST=127.0.0.1 KVPLANE_PORT=$http_port \
KVPLANE_MONITOR_PORTS="{\"pull\": ${ports[1]}, \"reply\": ${ports[2]}, \"heartbeat\": ${ports[3]}}" \
KVPLANE_API_TOKEN=$token KVPLANE_DOWNLINK_TIMEOUT=1 KVPLANE_HEALTH_CHECK_INTERVAL=-1 \
RUST_LOG=warn target/debug/kvplane serve >"$out/kvplane.log" 2>&1 &
kv=$!
pids+=("$kv")
for _ in $(seq 100); do
    curl -sf "$base/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "$base/readyz" >/dev/null

# Fake workers: instance "" answers every command, instance "0" never does (504 after 1 s).
target/debug/examples/fake_workers --reply "127.0.0.1:${ports[2]}" \
    >"$out/workers.log" 2>&1 &
pids+=("$!")
workers=0
for _ in $(seq 100); do
    workers=$(curl -sf "$base/controller/key-stats" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["total_worker_count"])')
    [ "$workers" = 2 ] && break
    sleep 0.1
done
[ "$workers" = 2 ] || { echo "fake workers did not register:"; cat "$out/workers.log"; exit 1; }

status=0
echo "== the --api-token rule on every route of /openapi.json"
"$py" - "$base" "$token" <<'EOF' || status=1
import json, sys, urllib.request, urllib.error
base, token = sys.argv[1], sys.argv[2]
doc = json.load(urllib.request.urlopen(base + "/openapi.json"))
MUTATING = {"/clear", "/pin", "/compress", "/decompress", "/move"}
def call(method, path, auth):
    req = urllib.request.Request(base + path, method=method.upper(),
                                 data=b"{}" if method == "post" else None)
    if method == "post":
        # A JSON body, so the same-origin guard (415 for non-JSON) lets the request reach auth.
        req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", auth)
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
bad = []
for path, ops in doc["paths"].items():
    for method, op in ops.items():
        guarded = "security" in op
        if guarded != (path in MUTATING):
            bad.append(f"{method.upper()} {path}: security declared={guarded}")
        for auth in (None, "Bearer wrong", "Basic " + token):
            s = call(method, path, auth)
            if guarded and s != 401:
                bad.append(f"{method.upper()} {path} with {auth!r}: {s}, expected 401")
            if not guarded and s == 401:
                bad.append(f"{method.upper()} {path} with {auth!r}: 401 on an open route")
        if guarded:
            s = call(method, path, "Bearer " + token)
            if s == 401:
                bad.append(f"{method.upper()} {path} with the token: 401")
print(f"   {sum(len(o) for o in doc['paths'].values())} operations, "
      f"{sum('security' in op for o in doc['paths'].values() for op in o.values())} guarded")
for b in bad:
    print("   FAIL", b)
sys.exit(1 if bad else 0)
EOF

echo "== schemathesis: $examples examples per operation, every check"
"$venv/bin/schemathesis" --config-file tests/schemathesis/schemathesis.toml \
    run "$base/openapi.json" \
    --checks all \
    --max-examples "$examples" \
    --phases examples,coverage,fuzzing \
    --header "Authorization: Bearer $token" \
    --seed 20261122 \
    --generation-database none \
    --workers 2 \
    --request-timeout 10 \
    --no-color \
    --report junit --report-dir "$out" \
    >"$out/schemathesis.txt" 2>&1 || status=1
tail -40 "$out/schemathesis.txt"

echo "== kvplane after the run"
if ! kill -0 "$kv" 2>/dev/null; then
    echo "   FAIL: kvplane died"; status=1
elif ! curl -sf "$base/healthz" >/dev/null; then
    echo "   FAIL: /healthz does not answer"; status=1
else
    curl -sf "$base/metrics" | awk '/^kvplane_http_requests_total/ {
            match($0, /status="[0-9]+"/); s = substr($0, RSTART + 8, 3); n[s] += $NF; t += $NF }
        END { printf "   %d requests answered, by status:", t; for (s in n) printf " %s×%d", s, n[s]; print "" }'
    five=$(curl -sf "$base/metrics" | awk '/^kvplane_http_requests_total/ && /status="5/ {print}')
    echo "   alive; 5xx answered, by route and status:"
    echo "${five:-   none}" | sed 's/^/   /'
    if echo "$five" | grep -v 'status="504"' | grep -v '^$' | grep -qv 'route="/readyz"'; then
        echo "   FAIL: a 5xx other than 504"; status=1
    fi
fi
grep -E "panicked|ERROR" "$out/kvplane.log" && { echo "   FAIL: errors in the log"; status=1; }
[ $status -eq 0 ] && echo "== schemathesis: OK" || echo "== schemathesis: FAILED (details in $out/)"
exit $status
