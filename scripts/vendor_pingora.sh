#!/usr/bin/env bash
# Rebuilds vendor/pingora-core: the published pingora-core crate (checked against its
# crates.io checksum) with the patches in vendor/patches applied. Cargo.toml's
# [patch.crates-io] builds Pingora from that copy (decision 197; vendor/README.md says why).
#
#   scripts/vendor_pingora.sh          rewrite vendor/pingora-core
#   scripts/vendor_pingora.sh --check  rebuild it in a temporary directory and fail if the
#                                      committed copy differs (an edit made outside a patch)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.9.1
SHA256=a535f47f65fdcb003f9e1df04cd18e614c128dfe9388acce3f211ae38ac14d68 # Cargo.lock's, before the patch
CRATE=pingora-core-$VERSION.crate
MODE=${1:-write}
[[ $MODE == write || $MODE == --check ]] || { echo "usage: $0 [--check]" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Cargo's download cache first (nothing to fetch on a machine that built Pingora before).
cached=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$CRATE" 2>/dev/null | head -1 || true)
if [[ -n $cached ]]; then
    cp "$cached" "$WORK/$CRATE"
else
    curl -fsSL --retry 3 -o "$WORK/$CRATE" "https://static.crates.io/crates/pingora-core/$CRATE"
fi
echo "$SHA256  $WORK/$CRATE" | sha256sum -c --quiet - ||
    { echo "vendor_pingora: $CRATE does not match its crates.io checksum" >&2; exit 1; }
tar -xzf "$WORK/$CRATE" -C "$WORK"
SRC=$WORK/pingora-core-$VERSION
rm -f "$SRC/.cargo_vcs_info.json" "$SRC/.cargo-ok"
for p in vendor/patches/pingora-core-$VERSION-*.patch; do
    # git apply works outside a repository too, and git is on every machine that has this checkout.
    git -C "$SRC" apply -p1 "$PWD/$p" || { echo "vendor_pingora: $p does not apply" >&2; exit 1; }
done

if [[ $MODE == --check ]]; then
    diff -r "$SRC" vendor/pingora-core >/dev/null ||
        { echo "vendor_pingora: vendor/pingora-core differs from pingora-core $VERSION + vendor/patches:" >&2
          diff -r "$SRC" vendor/pingora-core | head -40 >&2; exit 1; }
    echo "vendor_pingora: vendor/pingora-core is pingora-core $VERSION + $(ls vendor/patches/pingora-core-$VERSION-*.patch | wc -l) patch(es)"
else
    rm -rf vendor/pingora-core
    cp -r "$SRC" vendor/pingora-core
    echo "vendor_pingora: wrote vendor/pingora-core (pingora-core $VERSION + patches)"
fi
