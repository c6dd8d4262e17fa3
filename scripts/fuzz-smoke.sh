#!/usr/bin/env bash
# Runs every cargo-fuzz target briefly (CI smoke test), from seeds made of the LMCache 0.5.6
# golden vectors plus whatever fuzz/corpus/ already holds. Fails on any crash, leak or timeout
# libFuzzer reports; the failing input is left in fuzz/artifacts/<target>/.
#
#   scripts/fuzz-smoke.sh              # 20 s per target
#   FUZZ_SECONDS=600 scripts/fuzz-smoke.sh decode   # one target, longer
#
# Needs a nightly toolchain for the sanitizer flags; without one it builds with the stable
# toolchain and RUSTC_BOOTSTRAP=1. Installs cargo-fuzz if it is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(decode pull_frames http_bodies)
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

python3 fuzz/make_seeds.py tests/conformance/lmcache-0.5.6/controller_messages.jsonl

cd fuzz
echo "== building fuzz targets"
cargo "${toolchain[@]}" fuzz build -O >/dev/null
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== fuzz $t for ${seconds}s"
    log="$(mktemp)"
    if ! cargo "${toolchain[@]}" fuzz run -O "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        tail -60 "$log"
        echo "FAIL: fuzz target $t (input in fuzz/artifacts/$t/)"
        rm -f "$log"
        exit 1
    fi
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)|DONE' "$log" || true
    rm -f "$log"
done
echo "== fuzz smoke: every target ran clean"
