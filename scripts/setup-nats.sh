#!/usr/bin/env bash
# Installs nats-server (Debian's package) for the cluster tests (`--cluster`, docs/CLUSTER.md)
# when it is missing, and prints its path on stdout (everything else goes to stderr).
# Idempotent. Needs root (or sudo) for apt-get the first time.
set -euo pipefail
log() { printf '[setup-nats] %s\n' "$*" >&2; }
BIN="$(command -v nats-server || true)"
if [[ -z "$BIN" ]]; then
    SUDO=""
    [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
    log "installing Debian's nats-server (apt-get)"
    $SUDO apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
        nats-server >&2
    BIN="$(command -v nats-server || true)"
fi
[[ -n "$BIN" && -x "$BIN" ]] || { log "ERROR: nats-server still missing" >&2; exit 1; }
log "$("$BIN" --version)"
echo "$BIN"
