#!/usr/bin/env bash
# Builds the venv that runs a REAL LMCache 0.5.6 multi-process fleet CPU-only, for
# tests/interop/coordinator_fleet.rs and `kvplane bench coordinator --lmcache`: `lmcache server` (the MP
# server with its fs L2), `lmcache coordinator` and `lmcache bench server`, with the real torch
# 2.15.0 wheel from PyPI. Every package is pinned with its sha256 in
# tests/interop/requirements-mp.txt and installed with --require-hashes --no-deps (no resolver).
#
# Cost (measured on the CI image, 2 vCPU): a first build downloads ≈2.7 GB of wheels (torch plus
# the nvidia-* CUDA libraries torch preloads at import; they cannot be left out, see the
# requirements file) and installs a ≈5 GB venv in ≈2-4 min; pip's cache keeps the wheels, so a
# rebuild after a pin change costs the install only. Idempotent: a stamp in the venv records a
# hash of the requirements, of this script and of the interpreter; when it matches the script
# only prints the path (well under a second).
#
# Prints the venv path (the value for KVPLANE_MP_FLEET_VENV) on stdout; logs go to stderr.
# Usage: scripts/setup-mp-fleet.sh [--force]
# Env:   PYTHON=/path/to/python3.11   interpreter (the lmcache 0.5.6 wheel is cp311-only)
#        KVPLANE_MP_FLEET_VENV=/path   venv location (default <repo>/.venv-mp)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVPLANE_MP_FLEET_VENV:-$ROOT/.venv-mp}"
REQ="$ROOT/tests/interop/requirements-mp.txt"
STAMP="$VENV/.kvplane-mp-fleet-stamp"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1
log() { printf '[setup-mp-fleet] %s\n' "$*" >&2; }

PY=""
for cand in "${PYTHON:-}" python3.11 python3; do
    [[ -n "$cand" ]] && command -v "$cand" >/dev/null 2>&1 || continue
    if "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
        PY="$(command -v "$cand")"
        break
    fi
done
[[ -n "$PY" ]] || { log "ERROR: need Python 3.11 (set PYTHON=...)"; exit 1; }
PY_VERSION="$("$PY" -c 'import sys; print(sys.version.split()[0])')"
[[ -f "$REQ" ]] || { log "ERROR: $REQ missing"; exit 1; }
WANT="$( { cat "$REQ" "${BASH_SOURCE[0]}"; echo "python=$PY_VERSION"; } | sha256sum | cut -d' ' -f1)"

if [[ $FORCE -eq 0 && -x "$VENV/bin/lmcache" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "up to date: $VENV (lmcache 0.5.6, torch 2.15.0; stamp ${WANT:0:12})"
    echo "$VENV"
    exit 0
fi

START_NS=$(date +%s%N)
# A venv is rebuilt from scratch: removing packages that left the pin set in place is not
# worth the code for a venv that changes a few times a year.
log "creating $VENV with $PY ($PY_VERSION)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
log "installing the pinned set from ${REQ#"$ROOT"/} (--require-hashes --no-deps; ≈2.7 GB of wheels unless cached)"
"$VENV/bin/python" -m pip install --no-input --no-deps --only-binary=:all: --require-hashes \
    --progress-bar off -q -r "$REQ" >&2

# Smoke test: torch loads its CUDA libraries (no device needed), the native extension links
# against it, and the three entry points the tests run import.
log "smoke test: torch, lmcache_native, the MP server, coordinator and bench modules"
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 LMCACHE_DISABLE_BANNER=1 "$VENV/bin/python" - >&2 <<'PY'
import torch, lmcache.lmcache_native  # noqa: F401
import lmcache.v1.multiprocess.http_server  # noqa: F401
import lmcache.v1.mp_coordinator  # noqa: F401
from lmcache._version import __version__
assert __version__.startswith("0.5.6"), __version__
assert torch.__version__.startswith("2.15.0"), torch.__version__
print("lmcache", __version__, "torch", torch.__version__)
PY
[[ -x "$VENV/bin/lmcache" ]] || { log "ERROR: $VENV/bin/lmcache missing"; exit 1; }

echo "$WANT" > "$STAMP"
ELAPSED_MS=$(( ($(date +%s%N) - START_NS) / 1000000 ))
log "done in $((ELAPSED_MS / 1000)).$(printf '%03d' $((ELAPSED_MS % 1000)))s: $VENV ($(du -sh "$VENV" | cut -f1))"
echo "$VENV"
