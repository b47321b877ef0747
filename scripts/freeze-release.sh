#!/usr/bin/env bash
# Freezes the install script of the current extension version into
# migrations/, where tests/tests/release.rs holds every later build to it.
# Run it when a version is released (each version that lands on main is):
# from then on a schema change needs a new version and an upgrade script
# migrations/orca--OLD--NEW.sql.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
"$ORCA_ROOT/scripts/setup.sh" >/dev/null
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
src="$("$PG_CONFIG" --sharedir)/extension/orca--$version.sql"
cp "$src" "migrations/orca--$version.sql"
say "froze migrations/orca--$version.sql"
