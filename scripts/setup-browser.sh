#!/usr/bin/env bash
# Install what the dashboard browser test (tests/system/dashboard.rs) needs: Debian's `chromium` at
# /usr/bin/chromium (with `fonts-inter`: a clean Debian has no font at all, and the page's
# font stack starts with Inter), and `playwright-core` (which never downloads a browser) in
# tests/browser/node_modules, from the committed package-lock.json.
#
# Idempotent: when chromium is there and node_modules matches the lock file (a stamp holds the
# lock's hash), it only says so and exits.
#
# Usage: scripts/setup-browser.sh [--force]
# Needs: Node 20 + npm; root (or sudo) for apt-get when chromium is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/tests/browser"
LOCK="$DIR/package-lock.json"
STAMP="$DIR/node_modules/.kvplane-stamp"
CHROMIUM=/usr/bin/chromium
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[setup-browser] %s\n' "$*"; }

# --- chromium (Debian's package: no browser download from anywhere else) ---
FONT=/usr/share/fonts/opentype/inter/Inter-Regular.otf
if [[ ! -x "$CHROMIUM" || ! -f "$FONT" ]]; then
    SUDO=""
    [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
    log "installing Debian's chromium and fonts-inter (apt-get)"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
        chromium fonts-inter
fi
[[ -x "$CHROMIUM" ]] || { log "ERROR: $CHROMIUM still missing" >&2; exit 1; }

# --- playwright-core from the lock file -----------------------------------
command -v npm >/dev/null 2>&1 || { log "ERROR: npm not found (Node 20 needed)" >&2; exit 1; }
[[ -f "$LOCK" ]] || { log "ERROR: ${LOCK#$ROOT/} missing" >&2; exit 1; }
WANT="$( { cat "$LOCK"; node --version; } | sha256sum | cut -d' ' -f1)"
if [[ $FORCE -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "up to date: $("$CHROMIUM" --version 2>/dev/null || echo chromium), playwright-core (stamp ${WANT:0:12})"
    exit 0
fi
log "npm ci in ${DIR#$ROOT/}"
(cd "$DIR" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
echo "$WANT" > "$STAMP"
log "ready: $("$CHROMIUM" --version 2>/dev/null || echo chromium), playwright-core"
