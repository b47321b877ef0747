#!/usr/bin/env bash
# Builds Orca's Debian packages (docs/deploy.md):
#
#   postgresql-15-orca   the extension for PostgreSQL 15: orca.so, the
#                        control file, this build's install script and every
#                        released install and upgrade script (migrations/)
#   orca                 orca, orca-runner and orca-engine in /usr/bin, the
#                        systemd units of the runner and of `orca serve`,
#                        their settings in /etc/orca, the orca system user
#
#   scripts/package.sh [--out DIR] [--bins DIR] [extension] [binaries]
#
# --out: where the .deb files go (default dist/). --bins: take orca,
# orca-runner and orca-engine from DIR as they are instead of building them
# in release (the tests package the binaries they built). With neither
# extension nor binaries, both are built. It prints the path of each .deb.
#
# The version is Cargo.toml's; a version not yet in migrations/RELEASES is a
# development build and gets ~dev.<commit>, which sorts before the release.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"

usage() { die "usage: scripts/package.sh [--out DIR] [--bins DIR] [extension] [binaries]"; }
out="$ORCA_ROOT/dist"
bins=""
want_ext=0
want_bin=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
        --bins) [ $# -ge 2 ] || usage; bins=$2; shift 2 ;;
        extension) want_ext=1; shift ;;
        binaries) want_bin=1; shift ;;
        *) usage ;;
    esac
done
[ "$want_ext$want_bin" = 00 ] && want_ext=1 && want_bin=1
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps is missing (apt-get install dpkg-dev)"
mkdir -p "$out"
out=$(cd "$out" && pwd)

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
if ! grep -qE "^$version " migrations/RELEASES; then
    version="$version~dev.$(git rev-parse --short=10 HEAD 2>/dev/null || echo unknown)"
fi
arch=$(dpkg --print-architecture)
pg_major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')

# The Depends of files that link shared libraries, as dpkg-shlibdeps
# computes them (each library's package and the oldest version that has the
# symbols used). It reads a debian/control, so it runs in a scratch one.
shlib_depends() {
    local work args=() f
    work=$(mktemp -d "$stage/shlibs.XXXXXX")
    mkdir "$work/debian"
    printf 'Source: orca\n\nPackage: orca\nArchitecture: any\n' >"$work/debian/control"
    for f in "$@"; do args+=(-e "$(readlink -f "$f")"); done
    (cd "$work" && dpkg-shlibdeps -O "${args[@]}" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

# Builds one package from a staged tree; $1 the tree, $2 the file name.
build_deb() {
    local tree=$1 name=$2
    # md5sums, as dpkg --verify reads them.
    (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
        sort -z | xargs -0 -r md5sum >DEBIAN/md5sums)
    dpkg-deb --root-owner-group -Zxz -z6 --build "$tree" "$out/$name" >/dev/null
    echo "$out/$name"
}

stage=$(mktemp -d "${TMPDIR:-/tmp}/orca-package.XXXXXX")
trap 'rm -rf "$stage"' EXIT

if [ "$want_ext" = 1 ]; then
    say "building the extension for PostgreSQL $pg_major (cargo pgrx package, release)"
    pkg="postgresql-$pg_major-orca"
    tree="$stage/$pkg"
    cargo pgrx package -p orca-ext --pg-config "$PG_CONFIG" --out-dir "$tree" \
        >"$stage/pgrx.log" 2>&1 || { cat "$stage/pgrx.log" >&2; die "cargo pgrx package failed"; }
    extdir="$tree$("$PG_CONFIG" --sharedir)/extension"
    libdir="$tree$("$PG_CONFIG" --pkglibdir)"
    [ -f "$libdir/orca.so" ] || die "cargo pgrx package left no orca.so in $libdir"
    # Every release's install script and every upgrade script, so that an
    # old install upgrades (ALTER EXTENSION orca UPDATE) and an old
    # version can still be created.
    for f in migrations/orca--*.sql; do
        [ -e "$extdir/$(basename "$f")" ] || install -m 0644 "$f" "$extdir/"
    done
    find "$tree" -type d -exec chmod 0755 {} +
    find "$tree" -type f -exec chmod 0644 {} +
    mkdir -p "$tree/DEBIAN"
    depends=$(shlib_depends "$libdir/orca.so")
    cat >"$tree/DEBIAN/control" <<CONTROL
Package: $pkg
Version: $version
Architecture: $arch
Maintainer: Orca <orca@localhost>
Section: database
Priority: optional
Depends: postgresql-$pg_major, $depends
Description: Orca's control plane, a PostgreSQL $pg_major extension
 Data pipelines whose control plane is PostgreSQL: org-scoped metadata,
 schedules (cron with time zones, sensors, backfills), leases, lineage and an
 outbox, in Postgres transactions. Add orca to shared_preload_libraries for
 its background worker, then CREATE EXTENSION orca.
CONTROL
    build_deb "$tree" "${pkg}_${version}_${arch}.deb"
fi

if [ "$want_bin" = 1 ]; then
    if [ -z "$bins" ]; then
        say "building orca, orca-runner and orca-engine (release)"
        cargo build -q --release --locked -p orca-cli -p orca-runner -p orca-engine
        bins="$CARGO_TARGET_DIR/release"
    fi
    tree="$stage/orca"
    mkdir -p "$tree/usr/bin" "$tree/lib/systemd/system" "$tree/etc/orca" \
        "$tree/usr/share/doc/orca" "$tree/DEBIAN"
    for b in orca orca-runner orca-engine; do
        [ -x "$bins/$b" ] || die "$bins/$b is missing"
        install -m 0755 "$bins/$b" "$tree/usr/bin/$b"
        strip --strip-unneeded "$tree/usr/bin/$b"
    done
    for u in orca-runner.service orca-runner@.service orca-serve.service; do
        install -m 0644 "packaging/deb/$u" "$tree/lib/systemd/system/$u"
    done
    install -m 0640 packaging/deb/runner.env "$tree/etc/orca/runner.env"
    install -m 0640 packaging/deb/serve.env "$tree/etc/orca/serve.env"
    for d in deploy.md runner.md http.md security.md; do
        [ -f "docs/$d" ] && install -m 0644 "docs/$d" "$tree/usr/share/doc/orca/$d"
    done
    for s in postinst prerm postrm; do
        install -m 0755 "packaging/deb/orca.$s" "$tree/DEBIAN/$s"
    done
    printf '/etc/orca/runner.env\n/etc/orca/serve.env\n' >"$tree/DEBIAN/conffiles"
    depends=$(shlib_depends "$tree"/usr/bin/*)
    cat >"$tree/DEBIAN/control" <<CONTROL
Package: orca
Version: $version
Architecture: $arch
Maintainer: Orca <orca@localhost>
Section: admin
Priority: optional
Depends: adduser, ca-certificates, $depends
Recommends: postgresql-client
Description: Orca's command, runner and sync engine, with systemd units
 orca (the CLI and orca serve: HTTP API, console, webhooks, metrics),
 orca-runner (claims attempts and runs pipeline binaries) and orca-engine
 (syncs). Configure /etc/orca/runner.env and /etc/orca/serve.env, then
 systemctl enable --now orca-runner orca-serve.
CONTROL
    build_deb "$tree" "orca_${version}_${arch}.deb"
fi
