#!/usr/bin/env bash
# Orca's tasks as a job queue in the scenarios of the public harness
# hardbyte/postgresql-job-queue-benchmarking (see README.md here), on a
# private PostgreSQL with the harness's postgres.conf, driven natively by
# drive.py. Prints one line per cell; with PEER_NAME/PEER_CMD, the same
# cells for another adapter of that harness in the same run, after Orca's.
#
#   benches/jobqueue/run.sh                          chaos, pressure, peak
#   SCENARIOS=chaos SCALE=0.5 benches/jobqueue/run.sh
#   PEER_NAME=awa PEER_CMD=/path/to/awa-bench PEER_DB=awa_bench \
#     PEER_HOT_TABLE=awa.queue_ring_state benches/jobqueue/run.sh
#
# ONLY_PEER=1 runs the peer's cells alone (another connection budget, say).
# SCENARIOS: groups (chaos, pressure, peak) or single scenarios of drive.py.
# SCALE: phase durations against the harness's (1 = its own: the chaos cells
# take 4-5 minutes each); PRESSURE_SCALE for the pressure cells (default
# 0.05: theirs run 2 to 3 hours, at 0.05 each takes 5 to 10 minutes). RATE (600), WORKERS (32)
# and REPLICAS (2) for chaos and pressure; PEAK_WORKERS ("64 256") for peak.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
cd "$ORCA_ROOT"
HERE="$ORCA_ROOT/benches/jobqueue"
PY="${ORCA_TEST_PYTHON:-/var/tmp/orca-py/bin/python}"
SCENARIOS="${SCENARIOS:-chaos pressure peak}"
SCALE="${SCALE:-1}" PRESSURE_SCALE="${PRESSURE_SCALE:-0.05}" RATE="${RATE:-600}" WORKERS="${WORKERS:-32}" REPLICAS="${REPLICAS:-2}"
PEAK_WORKERS="${PEAK_WORKERS:-64 256}"
WORK="${JOBQUEUE_DIR:-/var/tmp/orca-jobqueue}"
PORT="${JOBQUEUE_PORT:-15555}"

"$ORCA_ROOT/scripts/setup.sh" >/dev/null
cargo build --release -q -p orca-jobqueue-adapter
ADAPTER="$CARGO_TARGET_DIR/release/orca-jobqueue-adapter"
[ -n "${PEER_CMD:-}" ] && { [ -n "${PEER_NAME:-}" ] && [ -n "${PEER_DB:-}" ] &&
    [ -n "${PEER_HOT_TABLE:-}" ] || die "PEER_CMD needs PEER_NAME, PEER_DB and PEER_HOT_TABLE"; }

# The server: the harness's postgres.conf (max_connections 400, its memory
# and autovacuum settings), with orca preloaded for its tick.
PGBIN="$("$PG_CONFIG" --bindir)"
mkdir -p "$WORK/logs"
chmod 0777 "$WORK" "$WORK/logs"
if [ ! -f "$WORK/data/PG_VERSION" ]; then
    as_postgres "$PGBIN/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    as_postgres tee -a "$WORK/data/postgresql.auto.conf" >/dev/null <<CONF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
max_connections = 400
shared_buffers = 256MB
work_mem = 8MB
maintenance_work_mem = 128MB
synchronous_commit = on
wal_level = replica
autovacuum = on
autovacuum_naptime = 60s
autovacuum_vacuum_cost_delay = 2ms
autovacuum_vacuum_cost_limit = 200
autovacuum_vacuum_scale_factor = 0.2
autovacuum_analyze_scale_factor = 0.1
autovacuum_vacuum_threshold = 50
autovacuum_analyze_threshold = 50
log_min_duration_statement = 5000
shared_preload_libraries = 'orca'
orca.databases = 'orca_bench'
orca.tick_ms = 1000
CONF
fi
# Commands for drive.py's shell: as the postgres OS user when we are root.
PGCTL="$(printf '%q' "$PGBIN/pg_ctl") -D $(printf '%q' "$WORK/data")"
[ "$(id -u)" = 0 ] && PGCTL="runuser -u postgres -- $PGCTL"
pg_start="$PGCTL -w -l $WORK/server.log start >/dev/null"
pg_stop_now="$PGCTL -m immediate -w stop >/dev/null"
pg_stop_fast="$PGCTL -m fast -w stop >/dev/null"
as_postgres "$PGBIN/pg_ctl" -D "$WORK/data" status >/dev/null 2>&1 && eval "$pg_stop_fast"
eval "$pg_start"
trap 'eval "$pg_stop_fast" || true' EXIT
ADMIN="postgres://postgres@127.0.0.1:$PORT/postgres"

echo "# $(date -u +%FT%TZ) $(nproc) cores; $(psql -Atc 'SHOW server_version' "$ADMIN"); SCALE=$SCALE PRESSURE_SCALE=$PRESSURE_SCALE RATE=$RATE WORKERS=$WORKERS REPLICAS=$REPLICAS"
echo "# chaos: recovery/baseline completion (the harness's Phase B ratio); pressure: stress/clean (Phase C); peak: depth-target 4000, 1 replica (Phase A)"

drive() { # name cmd db hot-table check-sql extension...
    local name=$1 cmd=$2 db=$3 hot=$4 check=$5; shift 5
    local ext=() e
    for e in "$@"; do ext+=(--extension "$e"); done
    local common=(--system "$name" --cmd "$cmd" --db "$db" --admin-url "$ADMIN" --hot-table "$hot"
        --pg-stop "$pg_stop_now" --pg-stop-fast "$pg_stop_fast" --pg-start "$pg_start"
        --pg-restart-between --scale "$SCALE" --pressure-scale "$PRESSURE_SCALE" --logs "$WORK/logs" --out "$WORK/results.jsonl"
        "${ext[@]}")
    [ -n "$check" ] && common+=(--check-sql "$check")
    local s rest=()
    for s in $SCENARIOS; do [ "$s" = peak ] || rest+=("$s"); done
    if [ ${#rest[@]} -gt 0 ]; then
        "$PY" "$HERE/drive.py" "${common[@]}" --scenarios "${rest[@]}" --rate "$RATE" \
            --workers "$WORKERS" --replicas "$REPLICAS"
    fi
    if [[ " $SCENARIOS " == *" peak "* ]]; then
        local w
        for w in $PEAK_WORKERS; do
            "$PY" "$HERE/drive.py" "${common[@]}" --scenarios peak --workers "$w" --replicas 1
        done
    fi
}

# Every task a cell added ends finished or is still queued or leased: none
# failed or was cancelled (a lost job would show as one of those).
ORCA_CHECK="SELECT status, count(*) AS batches, sum(cardinality(indexes)) AS tasks
            FROM orca.task_batches GROUP BY status ORDER BY status"
[ "${ONLY_PEER:-0}" = 1 ] || drive orca "$ADAPTER" orca_bench orca.task_batches "$ORCA_CHECK" orca
if [ -n "${PEER_CMD:-}" ]; then
    drive "$PEER_NAME" "$PEER_CMD" "$PEER_DB" "$PEER_HOT_TABLE" ""
fi
