#!/usr/bin/env bash
# Builds Orca's OCI images with buildah, no Docker engine (docs/deploy.md):
#
#   runner      FROM scratch: orca, orca-runner and orca-engine in /usr/bin,
#               the C libraries they link and the loader, CA certificates,
#               the user orca (10001) and its directories, nothing else.
#               Entrypoint orca-runner; pipeline images are built FROM it
#               (orca push).
#   extension   FROM scratch: /lib/orca.so and /share/extension/ (the
#               control file, this build's install script and every released
#               install and upgrade script), the layout CloudNativePG's
#               extension image volumes mount. For PostgreSQL 15 (this
#               machine's pg_config).
#
#   scripts/image.sh runner|extension [--tag REF] [--bins DIR] [--push REF]
#                    [--insecure-registry]
#
# --tag: the local name (default localhost/orca-runner:VERSION or
# localhost/orca-extension:VERSION-pg15). --bins: take the binaries from DIR
# as they are (default: built in release). --push: push it there after
# (--insecure-registry: plain HTTP or an unverified certificate, for a
# registry on loopback). Prints the local name, then the pushed reference
# with its digest. buildah runs as root with STORAGE_DRIVER (default vfs,
# which works everywhere) and BUILDAH_ISOLATION=chroot.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"

usage() { die "usage: scripts/image.sh runner|extension [--tag REF] [--bins DIR] [--push REF] [--insecure-registry]"; }
[ $# -ge 1 ] || usage
kind=$1
shift
case "$kind" in runner | extension) ;; *) usage ;; esac
tag=""
bins=""
push=""
tls=true
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) [ $# -ge 2 ] || usage; tag=$2; shift 2 ;;
        --bins) [ $# -ge 2 ] || usage; bins=$2; shift 2 ;;
        --push) [ $# -ge 2 ] || usage; push=$2; shift 2 ;;
        --insecure-registry) tls=false; shift ;;
        *) usage ;;
    esac
done
command -v buildah >/dev/null || die "buildah is missing (apt-get install buildah)"
export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
pg_major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
ctx=$(mktemp -d "${TMPDIR:-/tmp}/orca-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root"

labels=(
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$commit"
    --label "org.opencontainers.image.licenses=Apache-2.0"
)

if [ "$kind" = runner ]; then
    tag=${tag:-localhost/orca-runner:$version}
    if [ -z "$bins" ]; then
        say "building orca, orca-runner and orca-engine (release)"
        cargo build -q --release --locked -p orca-cli -p orca-runner -p orca-engine
        bins="$CARGO_TARGET_DIR/release"
    fi
    mkdir -p "$root/usr/bin"
    for b in orca orca-runner orca-engine; do
        [ -x "$bins/$b" ] || die "$bins/$b is missing"
        install -m 0755 "$bins/$b" "$root/usr/bin/$b"
        strip --strip-unneeded "$root/usr/bin/$b"
    done
    # The C libraries the binaries link, and the loader, at the paths the
    # binaries look for them (pipeline binaries built on this Debian link
    # the same ones).
    for lib in $(for b in "$root"/usr/bin/*; do
        ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
    done | sort -u); do
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
    mkdir -p "$root/etc/ssl/certs" "$root/proc" "$root/dev" "$root/tmp" \
        "$root/opt/orca/pipelines"
    chmod 1777 "$root/tmp"
    cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    printf 'root:x:0:0:root:/root:/sbin/nologin\norca:x:10001:10001:Orca:/var/lib/orca:/sbin/nologin\n' \
        >"$root/etc/passwd"
    printf 'root:x:0:\norca:x:10001:\n' >"$root/etc/group"
    owned="$ctx/owned"
    mkdir -p "$owned/var/lib/orca" "$owned/var/log/orca"
    cat >"$ctx/Containerfile" <<'EOF'
FROM scratch
COPY rootfs/ /
COPY --chown=10001:10001 owned/ /
USER 10001:10001
WORKDIR /var/lib/orca
ENV PATH=/usr/bin:/opt/orca/pipelines \
    HOME=/var/lib/orca \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    ORCA_PIPELINES=/opt/orca/pipelines \
    ORCA_LOGS=/var/log/orca \
    ORCA_WAREHOUSE=/var/lib/orca/warehouse
ENTRYPOINT ["/usr/bin/orca-runner"]
EOF
    labels+=(--label "org.opencontainers.image.title=orca-runner"
        --label "org.opencontainers.image.description=Orca's runner, with orca and orca-engine: the base of pipeline images (orca push)")
else
    tag=${tag:-localhost/orca-extension:$version-pg$pg_major}
    command -v cargo-pgrx >/dev/null || die "cargo-pgrx is missing (scripts/setup.sh installs it)"
    say "building the extension for PostgreSQL $pg_major (cargo pgrx package, release)"
    out="$ctx/pgrx"
    cargo pgrx package -p orca-ext --pg-config "$PG_CONFIG" --out-dir "$out" \
        >"$ctx/pgrx.log" 2>&1 || { cat "$ctx/pgrx.log" >&2; die "cargo pgrx package failed"; }
    mkdir -p "$root/lib" "$root/share/extension"
    install -m 0755 "$out$("$PG_CONFIG" --pkglibdir)/orca.so" "$root/lib/orca.so"
    cp "$out$("$PG_CONFIG" --sharedir)/extension/"orca* "$root/share/extension/"
    for f in migrations/orca--*.sql; do
        [ -e "$root/share/extension/$(basename "$f")" ] || install -m 0644 "$f" "$root/share/extension/"
    done
    chmod 0644 "$root/share/extension/"*
    printf 'FROM scratch\nCOPY rootfs/ /\n' >"$ctx/Containerfile"
    labels+=(--label "org.opencontainers.image.title=orca-extension"
        --label "org.opencontainers.image.description=The orca extension for PostgreSQL $pg_major: /lib/orca.so and /share/extension, for CloudNativePG's extension image volumes"
        --label "dev.orca.postgresql=$pg_major")
fi

say "building $tag"
buildah bud -q "${labels[@]}" -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
echo "$tag"
if [ -n "$push" ]; then
    buildah push -q --tls-verify="$tls" --digestfile "$ctx/digest" "$tag" "docker://$push"
    # The repository without the tag (a registry's port is no tag).
    repo=$push
    [[ ${push##*/} == *:* ]] && repo=${push%:*}
    echo "$repo@$(cat "$ctx/digest")"
fi
