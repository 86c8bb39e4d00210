#!/usr/bin/env bash
# Rebuilds vendor/pingora-core and vendor/pingora-proxy: the published crates (each checked
# against its crates.io checksum) with the patches in vendor/patches applied. Cargo.toml's
# [patch.crates-io] builds Pingora from those copies (decision 197; vendor/README.md says why).
#
#   scripts/vendor_pingora.sh          rewrite vendor/pingora-core and vendor/pingora-proxy
#   scripts/vendor_pingora.sh --check  rebuild them in a temporary directory and fail if a
#                                      committed copy differs (an edit made outside a patch)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.9.1
# Cargo.lock's checksums of the published crates, before the patches.
declare -A SHA256=(
    [pingora-core]=a535f47f65fdcb003f9e1df04cd18e614c128dfe9388acce3f211ae38ac14d68
    [pingora-proxy]=8e3d5670490740405ecc8c6f75c3fcbce4d24f7adaffb355ca44550e7918e358
)
MODE=${1:-write}
[[ $MODE == write || $MODE == --check ]] || { echo "usage: $0 [--check]" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0
for name in pingora-core pingora-proxy; do
    crate=$name-$VERSION.crate
    # Cargo's download cache first (nothing to fetch on a machine that built Pingora before).
    cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$crate" 2>/dev/null | head -1 || true)
    if [[ -n $cached ]]; then
        cp "$cached" "$WORK/$crate"
    else
        curl -fsSL --retry 3 -o "$WORK/$crate" "https://static.crates.io/crates/$name/$crate"
    fi
    echo "${SHA256[$name]}  $WORK/$crate" | sha256sum -c --quiet - ||
        { echo "vendor_pingora: $crate does not match its crates.io checksum" >&2; exit 1; }
    tar -xzf "$WORK/$crate" -C "$WORK"
    src=$WORK/$name-$VERSION
    rm -f "$src/.cargo_vcs_info.json" "$src/.cargo-ok"
    patches=(vendor/patches/"$name-$VERSION"-*.patch)
    for p in "${patches[@]}"; do
        # git apply works outside a repository too, and git is on every machine that has this checkout.
        git -C "$src" apply -p1 "$PWD/$p" || { echo "vendor_pingora: $p does not apply" >&2; exit 1; }
    done
    if [[ $MODE == --check ]]; then
        if diff -r "$src" "vendor/$name" >/dev/null; then
            echo "vendor_pingora: vendor/$name is $name $VERSION + ${#patches[@]} patch(es)"
        else
            echo "vendor_pingora: vendor/$name differs from $name $VERSION + vendor/patches:" >&2
            diff -r "$src" "vendor/$name" | head -40 >&2
            status=1
        fi
    else
        rm -rf "vendor/$name"
        cp -r "$src" "vendor/$name"
        echo "vendor_pingora: wrote vendor/$name ($name $VERSION + ${#patches[@]} patch(es))"
    fi
done
exit $status
