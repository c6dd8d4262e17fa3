#!/usr/bin/env bash
# Create/refresh the Python environment for kvplane's interop tests: a venv in
# <repo>/.venv holding the REAL LMCache 0.5.6 (installed --no-deps) plus the
# exact, pinned pure-Python set needed to run its controller
# (python -m lmcache.v1.api_server) and an LMCacheWorker CPU-only, without
# torch (tests/interop/stub_torch.py stands in for torch).
#
# Idempotent: a stamp file in the venv records a hash of the requirements, of
# this script and of the interpreter version; when it matches, the script only
# says so and exits (well under a second).
#
# Usage: scripts/setup-python.sh [--force]
# Env:   PYTHON=/path/to/python3.11   interpreter to build the venv from
#        KVPLANE_VENV=/path            venv location (default <repo>/.venv)
# Needs: Python 3.11 with the venv module and pip (ensurepip); network access
#        to PyPI (or a pip cache / PIP_FIND_LINKS holding the wheels).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVPLANE_VENV:-$ROOT/.venv}"
REQ="$ROOT/tests/interop/requirements.txt"
STAMP="$VENV/.kvplane-interop-stamp"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[setup-python] %s\n' "$*"; }

# --- pick a Python 3.11 (the lmcache 0.5.6 wheel is cp311) ---------------
pick_python() {
    local cand
    for cand in "${PYTHON:-}" python3.11 python3; do
        [[ -n "$cand" ]] || continue
        command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
            command -v "$cand"
            return 0
        fi
    done
    return 1
}
if ! PY="$(pick_python)"; then
    log "ERROR: need Python 3.11 (set PYTHON=...); the lmcache 0.5.6 wheel is cp311-only" >&2
    exit 1
fi
PY_VERSION="$("$PY" -c 'import sys; print(sys.version.split()[0])')"

[[ -f "$REQ" ]] || { log "ERROR: $REQ missing" >&2; exit 1; }
WANT="$( { cat "$REQ" "${BASH_SOURCE[0]}"; echo "python=$PY_VERSION"; } | sha256sum | cut -d' ' -f1)"

# --- fast path -----------------------------------------------------------
if [[ $FORCE -eq 0 && -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "up to date: $VENV (python $PY_VERSION, lmcache 0.5.6; stamp ${WANT:0:12})"
    exit 0
fi

START_NS=$(date +%s%N)

# --- (re)create the venv -------------------------------------------------
if [[ -x "$VENV/bin/python" ]]; then
    HAVE="$("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none)"
    if [[ "$HAVE" != "$PY_VERSION" ]]; then
        log "venv at $VENV has python $HAVE, want $PY_VERSION: recreating"
        rm -rf "$VENV"
    fi
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV with $PY ($PY_VERSION)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
else
    log "reusing venv $VENV (requirements changed or --force)"
fi
rm -f "$STAMP"

# --- install the exact pinned set, no resolver ----------------------------
log "installing pinned packages from ${REQ#$ROOT/} (pip --no-deps --only-binary=:all:)"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install \
    --no-input --no-deps --only-binary=:all: --progress-bar off -q \
    -r "$REQ"

# --- remove packages that are no longer pinned ----------------------------
# (keeps the venv equal to requirements.txt when pins change)
EXTRA="$("$VENV/bin/python" - "$REQ" <<'PY'
import re, sys, importlib.metadata as md
want = set()
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        want.add(re.split(r"[=<>!~ ;\[]", line, 1)[0].lower().replace("_", "-"))
keep = {"pip", "setuptools", "wheel"}
have = {d.metadata["Name"].lower().replace("_", "-") for d in md.distributions()}
print(" ".join(sorted(have - want - keep)))
PY
)"
if [[ -n "$EXTRA" ]]; then
    log "uninstalling packages not in requirements: $EXTRA"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip uninstall -y -q $EXTRA
fi

# --- check: every pinned package except lmcache has its deps --------------
# (lmcache's own torch/CUDA/transformers deps are intentionally absent)
BROKEN="$("$VENV/bin/python" -m pip check 2>/dev/null | grep -v '^lmcache ' || true)"
if [[ -n "$BROKEN" && "$BROKEN" != "No broken requirements found." ]]; then
    log "ERROR: incomplete pin set:" >&2
    printf '%s\n' "$BROKEN" >&2
    exit 1
fi

# --- smoke test: the real worker, sender and controller modules import -----
log "smoke test: importing lmcache worker, batched sender and controller with the torch stub"
SMOKE_ERR="$(mktemp)"
trap 'rm -f "$SMOKE_ERR"' EXIT
(cd "$ROOT/tests/interop" && "$VENV/bin/python" - <<'PY' 2>"$SMOKE_ERR"
import stub_torch
stub_torch.prepare_lmcache()
from lmcache.v1.cache_controller.worker import LMCacheWorker  # noqa: F401
stub_torch.skip_package_init("lmcache.v1.storage_backend")
from lmcache.v1.storage_backend.batched_message_sender import BatchedMessageSender  # noqa: F401
import lmcache.v1.api_server.__main__ as m  # noqa: F401
from lmcache._version import __version__
assert __version__.startswith("0.5.6"), __version__
print("lmcache", __version__)
PY
) | sed 's/^/[setup-python]   /' || { log "ERROR: smoke test failed:" >&2; tail -n 30 "$SMOKE_ERR" >&2; exit 1; }

echo "$WANT" > "$STAMP"
ELAPSED_MS=$(( ($(date +%s%N) - START_NS) / 1000000 ))
log "done in $((ELAPSED_MS / 1000)).$(printf '%03d' $((ELAPSED_MS % 1000)))s: $VENV ready"
log "  controller: $VENV/bin/python tests/interop/run_lmcache_controller.py --host 127.0.0.1 --port P --monitor-ports '{\"pull\":..,\"reply\":..,\"heartbeat\":..}'"
log "  worker:     $VENV/bin/python tests/interop/lmcache_worker.py --help"
