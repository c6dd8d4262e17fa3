#!/usr/bin/env bash
# Checks that the files the Dockerfile's build stage copies are enough to build kvplane:
#  1. copies exactly the sources of the build stage's COPY lines (Docker's rules: a directory's
#     contents go into the destination) into an empty directory, minus what .dockerignore
#     excludes;
#  2. runs `cargo metadata --locked --offline` there (manifest, lock file, [patch] paths,
#     declared targets);
#  3. checks that every file the sources include at compile time (`include_str!`,
#     `include_bytes!`, rust-embed's `#[folder]`) is there;
#  4. only if a Docker engine is reachable (`docker info` succeeds), runs a real `docker build`.
# CHECK_DOCKER_CONTEXT_BUILD=1 also runs `cargo check --locked --offline` in the copy (slow).
set -euo pipefail
cd "$(dirname "$0")/.."

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The build stage: the lines between the first FROM and the next FROM.
mapfile -t copies < <(awk '
    /^[[:space:]]*FROM[[:space:]]/ { stage++; next }
    stage == 1 && /^[[:space:]]*COPY[[:space:]]/ { sub(/^[[:space:]]*COPY[[:space:]]+/, ""); print }
' Dockerfile)
[ "${#copies[@]}" -gt 0 ] || { echo "no COPY line in the Dockerfile's build stage" >&2; exit 1; }

ignored() {
    local path="${1#./}" pattern
    [ -f .dockerignore ] || return 1
    while read -r pattern; do
        pattern="${pattern%/}"
        case "$pattern" in '' | '#'*) continue ;; esac
        if [ "$path" = "$pattern" ] || [ "${path#"$pattern"/}" != "$path" ]; then
            return 0
        fi
    done < .dockerignore
    return 1
}

echo "== docker context: the build stage's COPY lines"
for line in "${copies[@]}"; do
    read -r -a words <<<"$line"
    args=()
    for w in "${words[@]}"; do
        case "$w" in
            --from=*) echo "COPY $line: copying from another stage in the build stage is not checked" >&2; exit 1 ;;
            --*) ;;
            *) args+=("$w") ;;
        esac
    done
    [ "${#args[@]}" -ge 2 ] || { echo "COPY $line: needs a source and a destination" >&2; exit 1; }
    dest="${args[-1]}"
    unset 'args[-1]'
    case "$dest" in
        /*) echo "COPY $line: absolute destinations are not supported by this check" >&2; exit 1 ;;
    esac
    for src in "${args[@]}"; do
        [ -e "$src" ] || { echo "COPY $line: $src does not exist" >&2; exit 1; }
        ignored "$src" && { echo "COPY $line: $src is excluded by .dockerignore" >&2; exit 1; }
        echo "   $src -> $dest"
        if [ -d "$src" ]; then
            mkdir -p "$tmp/$dest"
            cp -a "$src/." "$tmp/$dest/"
        elif [ "${#args[@]}" -gt 1 ] || [[ "$dest" == */ ]] || [ "$dest" = "." ]; then
            mkdir -p "$tmp/$dest"
            cp -a "$src" "$tmp/$dest/"
        else
            mkdir -p "$(dirname "$tmp/$dest")"
            cp -a "$src" "$tmp/$dest"
        fi
    done
done

# `cargo metadata` resolves the packages of every platform (Windows-only ones too), and a
# machine that has only built for Linux has not downloaded those: fetch them first, so that
# the offline step below checks the context, not the local cache.
cargo fetch --locked --quiet
echo "== cargo metadata --locked --offline on exactly those files"
cargo metadata --locked --offline --format-version 1 --manifest-path "$tmp/Cargo.toml" >/dev/null

echo "== files included at compile time are in the copy"
missing=0
while IFS=: read -r file _ match; do
    target="$(sed -E 's/.*"([^"]+)".*/\1/' <<<"$match")"
    case "$match" in
        *folder*) path="$tmp/$target" ;;                        # rust-embed: from the manifest dir
        *) path="$tmp/$(dirname "$file")/$target" ;;             # include_*!: from the source file
    esac
    if [ ! -e "$path" ]; then
        echo "   $file includes $target, which the Dockerfile does not copy" >&2
        missing=1
    fi
done < <(cd "$tmp" && grep -rnoE '(include_str!|include_bytes!)\("[^"]+"\)|#\[folder = "[^"]+"\]' src || true)
[ "$missing" = 0 ]

if [ "${CHECK_DOCKER_CONTEXT_BUILD:-0}" = 1 ]; then
    echo "== cargo check --locked --offline in the copy"
    cargo check --locked --offline --bin kvplane --manifest-path "$tmp/Cargo.toml"
fi

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo "== docker build (a Docker engine is reachable)"
    docker build -t kvplane:context-check .
else
    echo "== docker build SKIPPED: no Docker engine reachable ('docker info' failed or docker is not installed); only the copy above was checked"
fi
echo "== docker context OK"
