# Sourced by the cluster benchmarks (bench-replicas.sh, bench-cluster.sh): the kvplane binary,
# a nats-server with JetStream on a free loopback port and a temp store, and cleanup of every
# process started (append pids to PIDS). Sets ROOT, BIN, NATS, NP (its port), SD (temp dir),
# and the helpers fp (a free port) and ready PORT (GET /readyz answers 200).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${KVPLANE_BIN:-$ROOT/target/release/kvplane}"
NATS="$(bash "$ROOT/scripts/setup-nats.sh")"
fp() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ready() { [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/readyz")" == 200 ]]; }
PIDS=()
SD="$(mktemp -d)"
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$SD"' EXIT
NP=$(fp)
"$NATS" -js -a 127.0.0.1 -p "$NP" -sd "$SD" >/dev/null 2>&1 & PIDS+=($!)
until (exec 3<>"/dev/tcp/127.0.0.1/$NP") 2>/dev/null; do sleep 0.05; done
