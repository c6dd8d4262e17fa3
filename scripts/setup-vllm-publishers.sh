#!/usr/bin/env bash
# Builds the environments that run vLLM's REAL KV-event publisher (ZmqEventPublisher from
# vllm/distributed/kv_events.py, no GPU, no torch) for tests/interop/indexer_vllm.rs: for each version
# in scripts/vllm-publisher/versions.txt, a venv with the pinned requirements and a `shim`
# directory holding vLLM's own two kv_events.py files (checked against their sha256) plus tiny
# stand-ins for the modules they import (scripts/vllm-publisher/make_shim.py).
#
# Idempotent: each environment has a stamp (hash of the inputs + interpreter version); when it
# matches nothing is downloaded. First build: one vLLM wheel per version (~300-450 MB each,
# pip download --no-deps; only 2 files are kept, the wheel is deleted).
#
# Prints the value for KVPLANE_VLLM_PUBLISHERS (colon-separated directories) on stdout; logs
# go to stderr. Usage: scripts/setup-vllm-publishers.sh
# Env: PYTHON=python3.x           interpreter for the venvs (default python3.11, else python3)
#      KVPLANE_VLLM_PUBLISHER_DIR where the environments live (default <repo>/target/vllm-publishers)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/scripts/vllm-publisher"
DIR="${KVPLANE_VLLM_PUBLISHER_DIR:-$ROOT/target/vllm-publishers}"
log() { printf '[setup-vllm-publishers] %s\n' "$*" >&2; }

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
PY_VERSION="$("$PY" -c 'import sys; print(sys.version.split()[0])')"
export PIP_DISABLE_PIP_VERSION_CHECK=1

START_NS=$(date +%s%N)
LIST=""
while read -r VER SUM_DIST SUM_CONF; do
    [[ -z "$VER" || "$VER" == \#* ]] && continue
    DEST="$DIR/$VER"
    WANT="$( { cat "$HERE/requirements.txt" "$HERE/make_shim.py" "${BASH_SOURCE[0]}"
               echo "$VER $SUM_DIST $SUM_CONF python=$PY_VERSION"; } | sha256sum | cut -d' ' -f1)"
    if [[ -x "$DEST/venv/bin/python" && -f "$DEST/stamp" && "$(cat "$DEST/stamp")" == "$WANT" ]]; then
        log "vLLM $VER: up to date ($DEST)"
    else
        log "vLLM $VER: building $DEST with $PY ($PY_VERSION)"
        rm -rf "$DEST"
        mkdir -p "$DEST/wheel"
        "$PY" -m venv "$DEST/venv"
        "$DEST/venv/bin/python" -m pip install --no-input --no-deps --only-binary=:all: \
            --progress-bar off -q -r "$HERE/requirements.txt"
        log "vLLM $VER: downloading the wheel (no dependencies)"
        "$DEST/venv/bin/python" -m pip download --no-input --no-deps --only-binary=:all: \
            --progress-bar off -q "vllm==$VER" -d "$DEST/wheel"
        WHEEL="$(ls "$DEST"/wheel/vllm-"$VER"-*.whl | head -1)"
        "$DEST/venv/bin/python" "$HERE/make_shim.py" "$WHEEL" "$DEST/shim" >&2
        rm -rf "$DEST/wheel"
        (cd "$DEST/shim" && printf '%s  %s\n%s  %s\n' \
            "$SUM_DIST" vllm/distributed/kv_events.py "$SUM_CONF" vllm/config/kv_events.py \
            | sha256sum --check --quiet) >&2 || {
            log "ERROR: vLLM $VER's kv_events.py files differ from scripts/vllm-publisher/versions.txt"
            exit 1
        }
        (cd "$DEST/shim" && "$DEST/venv/bin/python" -c \
            'from vllm.distributed.kv_events import ZmqEventPublisher, KVEventBatch') || {
            log "ERROR: vLLM $VER's publisher does not import"
            exit 1
        }
        echo "$WANT" > "$DEST/stamp"
    fi
    LIST="$LIST${LIST:+:}$DEST"
done < "$HERE/versions.txt"
ELAPSED_MS=$(( ($(date +%s%N) - START_NS) / 1000000 ))
log "ready in $((ELAPSED_MS / 1000)).$(printf '%03d' $((ELAPSED_MS % 1000)))s: $LIST"
echo "$LIST"
