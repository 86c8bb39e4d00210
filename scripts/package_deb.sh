#!/usr/bin/env bash
# Build the Debian package: the binary, the systemd unit, a default /etc/tollgate/ (conf/
# with its state moved to /var/lib/tollgate) and maintainer scripts that make the `tollgate`
# user, its state directory and its secrets.
#   scripts/package_deb.sh [--bin target/dist/tollgate] [--out target/deb] [--compression xz|gzip]
# Prints the path of the .deb. Installed with `dpkg -i`; checked by scripts/deb_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/dist/tollgate
OUT=target/deb
COMPRESSION=xz
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --compression) COMPRESSION=$2; shift 2 ;;
        *) echo "package_deb: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$BIN" ] || { echo "package_deb: no binary at $BIN (cargo build --profile dist -p tollgate-app --bin tollgate)" >&2; exit 1; }

VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
ARCH=$(dpkg --print-architecture)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

install -D -m 0755 "$BIN" "$STAGE/usr/bin/tollgate"
# Debug information stays with the build (Debian ships it apart, in -dbgsym packages).
strip --strip-debug "$STAGE/usr/bin/tollgate"
install -D -m 0644 packaging/tollgate.service "$STAGE/lib/systemd/system/tollgate.service"
sed -i -e 's#/usr/local/bin/tollgate#/usr/bin/tollgate#g' \
       -e '/^#   install -m 0644 packaging/d' "$STAGE/lib/systemd/system/tollgate.service"
install -D -m 0755 packaging/tollgate-upgrade.sh "$STAGE/usr/share/tollgate/tollgate-upgrade.sh"
sed -i 's#^BINARY=/usr/local/bin/tollgate#BINARY=/usr/bin/tollgate#' "$STAGE/usr/share/tollgate/tollgate-upgrade.sh"
install -d "$STAGE/etc/tollgate"
install -m 0644 conf/tollgate.yaml conf/models.yaml conf/upstreams.yaml "$STAGE/etc/tollgate/"
# conf/ keeps its state in ../data relative to the file; the package keeps it in the state
# directory the unit gives the service.
sed -i -e 's#\.\./data/#/var/lib/tollgate/#g' -e 's#--dir data/secrets#--dir /var/lib/tollgate/secrets#' \
    "$STAGE/etc/tollgate/tollgate.yaml"
if grep -n '\.\./data' "$STAGE/etc/tollgate/tollgate.yaml"; then
    echo "package_deb: a path in conf/tollgate.yaml still points into the checkout" >&2; exit 1
fi
install -D -m 0644 README.md "$STAGE/usr/share/doc/tollgate/README.md"
install -m 0644 docs/operations.md "$STAGE/usr/share/doc/tollgate/operations.md"

install -d "$STAGE/DEBIAN"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$STAGE/DEBIAN/"
printf '/etc/tollgate/tollgate.yaml\n/etc/tollgate/models.yaml\n/etc/tollgate/upstreams.yaml\n' > "$STAGE/DEBIAN/conffiles"
SIZE=$(du -sk "$STAGE" | cut -f1)
cat > "$STAGE/DEBIAN/control" <<CONTROL
Package: tollgate
Version: $VERSION
Architecture: $ARCH
Maintainer: tollgate maintainers <maintainers@tollgate.invalid>
Installed-Size: $SIZE
Depends: adduser, ca-certificates, passwd, util-linux
Section: net
Priority: optional
Homepage: https://github.com/tollgate/tollgate
Description: LLM inference gateway in front of self-hosted model replicas
 tollgate puts vLLM or SGLang replicas behind one HTTP gateway: workspace API keys,
 layered rate limits and admission, credits and coding plans, session affinity, the
 chat completions, Responses and messages dialects, and billing settled per request.
 The package runs it as the tollgate user under systemd, with its SQLite ledger and key
 secrets in /var/lib/tollgate and its configuration in /etc/tollgate.
CONTROL
mkdir -p "$OUT"
DEB="$OUT/tollgate_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group "-Z$COMPRESSION" --build "$STAGE" "$DEB" >/dev/null
echo "$DEB"
