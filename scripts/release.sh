#!/usr/bin/env bash
# Cuts a release of the orca extension: what a maintainer runs.
#
#   scripts/release.sh VERSION [--next NEXT]
#
# VERSION must be the version Cargo.toml builds now. The script builds and
# installs the extension, runs the release tests (every older release must
# upgrade to exactly a fresh VERSION install), freezes the install script as
# migrations/orca--VERSION.sql and records its sha256 and the commit it was
# built from in migrations/RELEASES. From then on that script never changes.
# With --next, it also opens NEXT: bumps Cargo.toml and starts the empty
# migrations/orca--VERSION--NEXT.sql that every later schema change goes into.
# It commits nothing: review, commit and tag (it prints the commands).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"

usage() { die "usage: scripts/release.sh VERSION [--next NEXT]"; }
[ $# -ge 1 ] || usage
version=$1
shift
next=""
while [ $# -gt 0 ]; do
    case "$1" in
        --next) [ $# -ge 2 ] || usage; next=$2; shift 2 ;;
        *) usage ;;
    esac
done
semver='^[0-9]+\.[0-9]+\.[0-9]+$'
[[ $version =~ $semver ]] || die "VERSION must be major.minor.patch, got '$version'"
[ -z "$next" ] || [[ $next =~ $semver ]] || die "NEXT must be major.minor.patch, got '$next'"

current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
[ "$current" = "$version" ] ||
    die "Cargo.toml builds $current, not $version: release the version you built"
grep -qE "^$version " migrations/RELEASES && die "$version is already released (migrations/RELEASES)"
[ -z "$(git status --porcelain)" ] ||
    die "the working tree has changes: a release is cut from a commit (git status)"
commit=$(git rev-parse HEAD)

say "building and installing $version"
"$ORCA_ROOT/scripts/setup.sh" >/dev/null
say "release tests: every release upgrades to a fresh $version"
cargo test -q -p orca-tests --test release -- --test-threads 2

installed="$("$PG_CONFIG" --sharedir)/extension/orca--$version.sql"
[ -f "$installed" ] || die "no installed $installed"
cp "$installed" "migrations/orca--$version.sql"
sum=$(sha256sum "migrations/orca--$version.sql" | cut -d' ' -f1)
echo "$version $sum $commit" >>migrations/RELEASES
say "froze migrations/orca--$version.sql (sha256 $sum, built from $commit)"

if [ -n "$next" ]; then
    sed -i "0,/^version = \"$version\"/s//version = \"$next\"/" Cargo.toml
    cat >"migrations/orca--$version--$next.sql" <<SQL
-- Upgrades the orca extension from $version to $next: ALTER EXTENSION orca UPDATE.
--
-- Every schema change of $next goes here as well as into sql/; the release
-- test installs $version, runs this script and compares the catalog with a
-- fresh $next install.

\\echo Use "ALTER EXTENSION orca UPDATE TO '$next'" to load this file. \\quit
SQL
    cargo metadata --format-version 1 >/dev/null # refreshes Cargo.lock's versions
    say "opened $next: Cargo.toml bumped, migrations/orca--$version--$next.sql started"
fi

cat <<TXT

Next:
  git add migrations Cargo.toml Cargo.lock
  git commit -m "release $version${next:+; open $next}"
  git tag v$version
TXT
