#!/usr/bin/env bash
# Installs older LMCache releases beside the MP-fleet venv, for tests/interop/versions.rs: real
# workers of every controller-wire generation registered with one kvplane at once.
#
# Each release goes into its own folder with `pip install --target --no-deps --require-hashes`
# (the wheel alone, ~4-13 MB) and runs on the MP-fleet venv's interpreter, whose real torch
# 2.15.0 and pure-Python packages it shares (scripts/setup-mp-fleet.sh builds that venv; this
# script calls it when it is missing). None of these releases pins torch, and the controller
# client (cache_controller.worker, its message classes, the batched sender) imports no compiled
# LMCache extension, so one torch CPU wheel serves every version: the test puts a release's
# folder first on PYTHONPATH, ahead of the venv's own lmcache 0.5.6.
#
#   0.3.9   registration and heartbeats pushed with `distributed_url`, one KVAdmitMsg/KVEvictMsg
#           per op, no reply to registration, no full sync
#   0.3.11  `peer_init_url`, batched ops with sequence numbers; still pushed, still no reply
#   0.4.7   the REQ-REP registration (RegisterRetMsg), heartbeat commands and full sync
#           (the same wire as 0.3.12 through 0.5.6; 0.5.6 itself is the venv's own)
#
# Cost (measured on the CI image, 2 shared vCPUs, MP-fleet venv already there): ≈25 MB of
# wheels downloaded, ≈104 MB installed, 42 s the first time (most of it the three smoke
# imports of torch); well under a second when the stamp matches.
#
# Prints the folder holding one sub-folder per version (the value for KVPLANE_LMCACHE_VERSIONS)
# on stdout; logs go to stderr.
# Usage: scripts/setup-lmcache-versions.sh [--force]
# Env:   KVPLANE_MP_FLEET_VENV=/path   the venv with torch (default <repo>/.venv-mp)
#        KVPLANE_LMCACHE_VERSIONS=/path  where to install (default <repo>/target/lmcache-versions)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${KVPLANE_LMCACHE_VERSIONS:-$ROOT/target/lmcache-versions}"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
log() { printf '[setup-lmcache-versions] %s\n' "$*" >&2; }

# version and the sha256 of its cp311 manylinux x86_64 wheel on PyPI
WHEELS=(
    "0.3.9 01f5ed4ac2efc39964ff6299e4de9e635cbe012fe0dc767b50749ebf817cbd28"
    "0.3.11 9c8f552ecfd501b335cc6c82b3d8a32e9a610130dc8469d3e45241d5a3e2780f"
    "0.4.7 79022445f3129350d37ef949961c4c3ca3f528c73ed5b45ee8c2b01916e6071d"
)

VENV="${KVPLANE_MP_FLEET_VENV:-$ROOT/.venv-mp}"
if [[ ! -x "$VENV/bin/python" ]]; then
    log "no MP-fleet venv at $VENV: building it (scripts/setup-mp-fleet.sh)"
    VENV="$(bash "$ROOT/scripts/setup-mp-fleet.sh")"
fi
PY="$VENV/bin/python"

STAMP="$DEST/.kvplane-versions-stamp"
WANT="$( { printf '%s\n' "${WHEELS[@]}"; cat "${BASH_SOURCE[0]}"; "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
if [[ $FORCE -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "up to date: $DEST (stamp ${WANT:0:12})"
    echo "$DEST"
    exit 0
fi

START_NS=$(date +%s%N)
rm -rf "$DEST"
mkdir -p "$DEST"
REQ="$(mktemp)"
trap 'rm -f "$REQ"' EXIT
for entry in "${WHEELS[@]}"; do
    read -r version sha <<<"$entry"
    printf 'lmcache==%s --hash=sha256:%s\n' "$version" "$sha" >"$REQ"
    log "lmcache $version -> $DEST/$version"
    "$PY" -m pip install --no-input --no-deps --only-binary=:all: --require-hashes \
        --progress-bar off -q --target "$DEST/$version" -r "$REQ" >&2
    # Smoke test: this version's controller client imports on the shared torch.
    (cd "$DEST" && PYTHONPATH="$DEST/$version" LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 \
        "$PY" - "$version" >&2 <<'PY'
import sys
import torch  # noqa: F401
import lmcache.v1.cache_controller.worker  # noqa: F401
from lmcache._version import __version__
assert __version__ == sys.argv[1], (__version__, sys.argv[1])
print("lmcache", __version__, "imports on torch", torch.__version__)
PY
    )
done

echo "$WANT" >"$STAMP"
ELAPSED_MS=$(( ($(date +%s%N) - START_NS) / 1000000 ))
log "done in $((ELAPSED_MS / 1000)).$(printf '%03d' $((ELAPSED_MS % 1000)))s: $DEST ($(du -sh "$DEST" | cut -f1))"
echo "$DEST"
