#!/usr/bin/env bash
# Builds the Python environment tests/router/routing.rs compares kvplane's tokenizer against
# (scripts/router-tokenizers/requirements.txt: the `tokenizers` library and transformers) in
# <repo>/target/tokenizers-venv, and prints its interpreter's path for
# KVPLANE_TOKENIZERS_PYTHON. Idempotent: a stamp of the inputs; when it matches nothing is
# downloaded. Logs go to stderr.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/scripts/router-tokenizers"
DEST="${KVPLANE_TOKENIZERS_VENV:-$ROOT/target/tokenizers-venv}"
PY="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
log() { printf '[setup-tokenizers] %s\n' "$*" >&2; }
WANT="$( { cat "$HERE/requirements.txt" "${BASH_SOURCE[0]}"; "$PY" --version; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$DEST/bin/python" && -f "$DEST/stamp" && "$(cat "$DEST/stamp")" == "$WANT" ]]; then
    log "up to date ($DEST)"
else
    log "building $DEST"
    rm -rf "$DEST"
    "$PY" -m venv "$DEST"
    "$DEST/bin/python" -m pip install --no-input --progress-bar off -q -r "$HERE/requirements.txt" >&2
    echo "$WANT" > "$DEST/stamp"
fi
echo "$DEST/bin/python"
