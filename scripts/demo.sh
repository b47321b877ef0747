#!/usr/bin/env bash
# The quick start: sets everything up and runs Orca end to end on an embedded
# default: a private PostgreSQL cluster under .orca/ with the extension
# preloaded (its background worker ticks every second), a runner, and the
# example pipeline examples/hello. It shows a backfill being claimed and
# finished, and the pipeline's schedule firing.
#
#   scripts/demo.sh          run the demo; the cluster stays up for you to explore
#   scripts/demo.sh stop     stop the private cluster
#   ORCA_DEMO_STOP=1 scripts/demo.sh   stop everything at the end (CI)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
export ORCA_PGDIR="${ORCA_PGDIR:-$ORCA_ROOT/.orca/pg}"
export ORCA_PGPORT="${ORCA_PGPORT:-54329}"
source "$ORCA_ROOT/scripts/cluster.sh"

if [ "${1:-}" = "stop" ]; then
    cluster_stop
    say "private cluster stopped"
    exit 0
fi

# The postgres user must reach the cluster directory; a clone under a private
# home directory is not reachable, so fall back to /var/tmp.
mkdir -p "$(dirname "$ORCA_PGDIR")"
if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$(dirname "$ORCA_PGDIR")"; then
    ORCA_PGDIR="/var/tmp/orca-demo-$(echo "$ORCA_ROOT" | sha256sum | cut -c1-8)/pg"
    say "postgres cannot reach $ORCA_ROOT; the cluster goes to $ORCA_PGDIR"
fi

"$ORCA_ROOT/scripts/setup.sh"
say "building the runner"
cargo build --release -q -p orca-runner
RUNNER="$CARGO_TARGET_DIR/release/orca-runner"
cluster_start

URL="$(cluster_url orca)"
PSQL=(psql -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$ORCA_PGPORT" -U postgres)
"${PSQL[@]}" -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'orca'" | grep -q 1 ||
    "${PSQL[@]}" -d postgres -qc "CREATE DATABASE orca"
# The worker waits for the database; a fresh install of the extension replaces an old one.
"${PSQL[@]}" -d orca -qc "SET client_min_messages = warning" -c "DROP EXTENSION IF EXISTS orca CASCADE" -c "CREATE EXTENSION orca"

say "registering examples/hello"
"${PSQL[@]}" -d orca -qAt -c "SELECT 'version ' || orca.register(\$m\$$(examples/hello/hello describe --json)\$m\$::jsonb)"
"${PSQL[@]}" -d orca -c "SELECT * FROM orca.fires('hello', 3)"

LOGS="$(dirname "$ORCA_PGDIR")/logs"
say "starting a runner (log: $LOGS/runner.out)"
mkdir -p "$LOGS"
"$RUNNER" --database-url "$URL" --name demo-runner --slots 2 --logs "$LOGS" --grace-seconds 5 \
    >"$LOGS/runner.out" 2>&1 &
RUNNER_PID=$!
stop_runner() { kill -TERM "$RUNNER_PID" 2>/dev/null && wait "$RUNNER_PID" 2>/dev/null || true; }
trap stop_runner EXIT

say "backfill: SELECT orca.backfill('hello', '2024-01..2024-03')"
"${PSQL[@]}" -d orca -c "SELECT orca.backfill('hello', '2024-01..2024-03')"

wait_for() { # description, SQL returning true when done, seconds
    local i
    for ((i = 0; i < $3 * 2; i++)); do
        [ "$("${PSQL[@]}" -d orca -Atqc "$2")" = t ] && return 0
        sleep 0.5
    done
    echo "--- runner output ---" >&2
    tail -30 "$LOGS/runner.out" >&2
    die "timed out waiting for $1"
}
wait_for "the backfill to finish" \
    "SELECT count(*) = 3 FROM orca.runs WHERE trigger = 'backfill' AND status = 'succeeded'" 60
"${PSQL[@]}" -d orca -c "SELECT run, partitions, trigger, status, attempts, steps_succeeded || '/' || steps_total AS steps, duration FROM orca.run_overview WHERE trigger = 'backfill' ORDER BY run"
"${PSQL[@]}" -d orca -c "SELECT s.run_id AS run, s.step, s.partition, s.status, s.output FROM orca.step_states s JOIN orca.runs r ON r.id = s.run_id WHERE r.trigger = 'backfill' ORDER BY s.run_id, s.step, s.partition"

say "waiting for the schedule (* * * * *) to fire: the background worker ticks every second"
wait_for "a scheduled run" \
    "SELECT EXISTS (SELECT 1 FROM orca.runs WHERE trigger = 'schedule' AND status = 'succeeded')" 90
"${PSQL[@]}" -d orca -c "SELECT run, partitions, trigger, status, fire_at, duration FROM orca.run_overview WHERE trigger = 'schedule' ORDER BY run"
"${PSQL[@]}" -d orca -c "SELECT kind, count(*) FROM orca.events GROUP BY kind ORDER BY min(id)"

stop_runner
trap - EXIT
say "done. Explore: psql '$URL'   (stop the cluster: scripts/demo.sh stop)"
if [ "${ORCA_DEMO_STOP:-0}" = 1 ]; then
    cluster_stop
fi
