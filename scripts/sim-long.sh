#!/usr/bin/env bash
# A long run of the engine simulation (tests/sim/tests/engine_sim.rs) in a
# private cluster of a frozen copy of this machine's PostgreSQL installation,
# with the orca extension as built now. A long run takes most of an hour; a
# new build installed meanwhile (scripts/setup.sh, CI on the same machine)
# would otherwise replace the extension's library under the simulation's
# connections and fail it with "could not access file $libdir/orca".
#
#   scripts/sim-long.sh                       # ENGINE_SEEDS=10000: about 40 minutes on 2 cores
#   ENGINE_SEEDS=1000 scripts/sim-long.sh
#   SIM_PORT=54350 scripts/sim-long.sh        # another port for the private cluster
#
# Prints the simulation's summary (`N seeds: EngineOutcome {...}`), or the
# failing seed with its trace; the per-record JSON trace lines are left out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
export ENGINE_SEEDS="${ENGINE_SEEDS:-10000}"
port="${SIM_PORT:-54341}"

"$ORCA_ROOT/scripts/setup.sh" >/dev/null
cargo test -q -p orca-sim --test engine_sim --no-run

# PostgreSQL finds its library and share directories relative to its
# binaries, so a copy under the same relative layout is a whole installation.
bindir="$("$PG_CONFIG" --bindir)"
sharedir="$("$PG_CONFIG" --sharedir)"
frozen="$(mktemp -d /var/tmp/orca-sim-pg.XXXXXX)"
cleanup() {
    if [ -f "$frozen/data/postmaster.pid" ]; then
        as_postgres "$frozen$bindir/pg_ctl" -D "$frozen/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$frozen"
}
trap cleanup EXIT
mkdir -p "$frozen$(dirname "$(dirname "$bindir")")" "$frozen$(dirname "$sharedir")"
cp -a "$(dirname "$bindir")" "$frozen$(dirname "$(dirname "$bindir")")/"
cp -a "$sharedir" "$frozen$(dirname "$sharedir")/"
[ -f "$frozen$("$PG_CONFIG" --pkglibdir)/orca.so" ] || die "the frozen copy has no orca.so"

say "a private cluster of the frozen installation on port $port"
mkdir -p "$frozen/data"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$frozen" "$frozen/data"
as_postgres "$frozen$bindir/initdb" -D "$frozen/data" -U postgres --auth=trust -E UTF8 \
    --no-sync >/dev/null
as_postgres "$frozen$bindir/pg_ctl" -D "$frozen/data" -w -l "$frozen/server.log" \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $frozen" start >/dev/null

say "engine simulation, $ENGINE_SEEDS seeds"
ORCA_SIM_PG="postgres://postgres@127.0.0.1:$port" \
    cargo test -q -p orca-sim --test engine_sim -- --nocapture 2>&1 | grep -v '^{"at"'
