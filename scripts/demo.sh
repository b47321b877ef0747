#!/usr/bin/env bash
# The quick start: sets everything up and runs Orca end to end on an embedded
# default: a private PostgreSQL cluster under .orca/ with the extension
# preloaded (its background worker ticks every second), a runner, and the
# example pipelines of examples/ built on the Rust SDK. It registers them with
# the orca CLI, backfills three months of the lake pipeline and follows the
# runs, labels each airport the lake holds with the keyed pipeline labels, then
# waits for the onthisday pipeline's one-minute schedule to fire.
#
#   scripts/demo.sh          run the demo; the cluster stays up for you to explore
#   scripts/demo.sh stop     stop the private cluster
#   ORCA_DEMO_STOP=1 scripts/demo.sh   stop everything at the end (CI)
#   ORCA_DEMO_BINARIES=e2e scripts/demo.sh   the binaries the end-to-end tests built, unbuilt,
#                                            and no setup (CI: scripts/test.sh ran it)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ORCA_ROOT"
export ORCA_PGDIR="${ORCA_PGDIR:-$ORCA_ROOT/.orca/pg}"
export ORCA_PGPORT="${ORCA_PGPORT:-54329}"
source "$ORCA_ROOT/scripts/cluster.sh"

# orca serve (the console and the HTTP API), started at the end of the demo.
SERVE_PID="$ORCA_ROOT/.orca/serve.pid"
serve_stop() {
    if [ -f "$SERVE_PID" ]; then
        kill -TERM "$(cat "$SERVE_PID")" 2>/dev/null || true
        rm -f "$SERVE_PID"
    fi
}

if [ "${1:-}" = "stop" ]; then
    serve_stop
    cluster_stop
    say "private cluster and orca serve stopped"
    exit 0
fi

# The postgres user must reach the cluster directory; a clone under a private
# home directory is not reachable, so fall back to /var/tmp.
mkdir -p "$(dirname "$ORCA_PGDIR")"
if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$(dirname "$ORCA_PGDIR")"; then
    ORCA_PGDIR="/var/tmp/orca-demo-$(echo "$ORCA_ROOT" | sha256sum | cut -c1-8)/pg"
    say "postgres cannot reach $ORCA_ROOT; the cluster goes to $ORCA_PGDIR"
fi

# CI's run (ORCA_DEMO_BINARIES=e2e) comes after scripts/test.sh ran the
# setup, and beside servers that have the extension's library loaded, which
# installing it again would copy over in place.
if [ "${ORCA_DEMO_BINARIES:-build}" != e2e ]; then
    "$ORCA_ROOT/scripts/setup.sh"
fi
# The binaries are built with the dev profile into the target directory the
# test suite builds in: scripts/test.sh after the demo compiles only its
# test targets (and the crates the tests' fault hooks change), never
# DataFusion again.
BIN="$CARGO_TARGET_DIR/debug"
if [ "${ORCA_DEMO_BINARIES:-build}" = e2e ]; then
    # scripts/test.sh, after the tests: the binaries the end-to-end tests
    # built (tests/src/procs.rs) as they are.
    for b in orca orca-runner orca-engine lake weather onthisday labels; do
        [ -x "$BIN/$b" ] || die "$BIN/$b is missing: ORCA_DEMO_BINARIES=e2e takes the binaries the end-to-end tests built"
    done
else
    say "building the runner, the orca CLI and the example pipelines (the first time on 2 cores: about 4 minutes, DataFusion most of it; cargo prints each crate it compiles)"
    t0=$(date +%s)
    cargo build -p orca-runner -p orca-cli -p orca-engine -p example-lake \
        -p example-weather -p example-onthisday -p example-labels
    say "built in $(($(date +%s) - t0)) s"
fi
cluster_start

export DATABASE_URL
DATABASE_URL="$(cluster_url orca)"
PSQL=(psql -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$ORCA_PGPORT" -U postgres)
"${PSQL[@]}" -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'orca'" | grep -q 1 ||
    "${PSQL[@]}" -d postgres -qc "CREATE DATABASE orca"
# A fresh install of the extension each time: the demo starts from nothing
# (the Iceberg catalog's tables go with the extension; a cluster of an older
# demo may hold them outside it).
"${PSQL[@]}" -d orca -qc "SET client_min_messages = warning" \
    -c "DROP EXTENSION IF EXISTS orca CASCADE" \
    -c "DROP TABLE IF EXISTS iceberg_tables, iceberg_namespace_properties" \
    -c "CREATE EXTENSION orca"

say "registering the example pipelines"
for p in lake weather onthisday labels; do
    "$BIN/orca" locate "$BIN/$p" --root "$ORCA_ROOT/examples" >/dev/null
    "$BIN/orca" register "$BIN/$p"
done
"$BIN/lake" describe
say "orca fires weather 3"
"$BIN/orca" fires weather 3

LOGS="$(dirname "$ORCA_PGDIR")/logs"
# The examples' data from this checkout (a binary built in another checkout
# that shares the target directory would otherwise read that one's).
export ORCA_EXAMPLE_DATA="$ORCA_ROOT/examples/data"
# Iceberg data and metadata; the catalog is in the same database.
export ORCA_WAREHOUSE
ORCA_WAREHOUSE="$(dirname "$ORCA_PGDIR")/warehouse"
rm -rf "$ORCA_WAREHOUSE"
# Syncs' checkpoints, staged epochs and logs (the runner's orca-engine reads it).
export ORCA_STORE
ORCA_STORE="$(dirname "$ORCA_PGDIR")/store"
rm -rf "$ORCA_STORE"
# The runner runs as docs/security.md recommends: a login in orca_runner
# only, with a runner token of the org and pool, and its children (the
# pipelines and orca-engine) on a login in orca_attempt only. Tables are
# read back below through a login in orca_viewer, the catalog's read-only
# role.
"${PSQL[@]}" -d orca -q <<'SQL'
SET client_min_messages = warning;
DO $$
BEGIN
    CREATE ROLE demo_runner LOGIN IN ROLE orca_runner;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE demo_attempt LOGIN IN ROLE orca_attempt;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE demo_reader LOGIN IN ROLE orca_viewer;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
SELECT orca.add_member('default', 'demo_reader');
SQL
mkdir -p "$LOGS" "$ORCA_WAREHOUSE"
TOKEN_FILE="$LOGS/runner.token"
(umask 077 && "${PSQL[@]}" -d orca -Atqc \
    "SELECT orca.create_runner_token('default', 'demo-' || to_char(clock_timestamp(), 'YYYYMMDD-HH24MISS-US'))" \
    >"$TOKEN_FILE")
READER_URL="postgres://demo_reader@127.0.0.1:$ORCA_PGPORT/orca"
say "starting a runner as demo_runner with a runner token (its output: $LOGS/runner.out; tables under $ORCA_WAREHOUSE)"
"$BIN/orca-runner" --name demo-runner --slots 2 --logs "$LOGS" --grace-seconds 5 \
    --database-url "postgres://demo_runner@127.0.0.1:$ORCA_PGPORT/orca" \
    --token-file "$TOKEN_FILE" \
    --attempt-database-url "postgres://demo_attempt@127.0.0.1:$ORCA_PGPORT/orca" \
    --pipelines "$BIN" \
    >"$LOGS/runner.out" 2>&1 &
RUNNER_PID=$!
stop_runner() { kill -TERM "$RUNNER_PID" 2>/dev/null && wait "$RUNNER_PID" 2>/dev/null || true; }
trap stop_runner EXIT

say "orca backfill lake 2013-01..2013-03"
"$BIN/orca" backfill lake 2013-01..2013-03
"$BIN/orca" runs --pipeline lake
first=$("${PSQL[@]}" -d orca -Atqc "SELECT min(id) FROM orca.runs WHERE trigger = 'backfill'")
say "orca run $first"
"$BIN/orca" run "$first" --logs "$LOGS"

say "lake.monthly, read back by PyIceberg through the same catalog, as demo_reader (orca_viewer)"
"${ORCA_TEST_PYTHON:-/var/tmp/orca-py/bin/python}" - "$READER_URL" "$ORCA_WAREHOUSE" <<'PY'
import sys
from pyiceberg.catalog.sql import SqlCatalog
url, wh = sys.argv[1].replace("postgres://", "postgresql+psycopg2://"), sys.argv[2]
t = SqlCatalog("default", uri=url, warehouse="file://" + wh).load_table("lake.monthly")
for row in sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["month"]):
    print("  ", row)
s = t.current_snapshot().summary.additional_properties
print("   snapshot summary:", {k: v for k, v in s.items() if k.startswith("orca.")})
PY
"${PSQL[@]}" -d orca -c "SELECT direction, depth, related, via, pipeline, run FROM orca.lineage('lake.clean')"

# Each month's clean step read its month's file of lake.raw alone (the
# tables are partitioned by month); table maintenance then keeps the table's
# history bounded: one snapshot kept, the others expired with their files.
say "orca maintain lake.raw (compact small files, expire snapshots, remove orphan files)"
"$BIN/orca" maintain lake.raw \
    --options '{"expire": {"keep_last": 1, "older_than": "0 seconds", "grace": "0 seconds"}}'

# labels is keyed by the airports in lake.clean and is a sensor: the lake's
# commits started runs for the airports they brought. A backfill of @all runs
# whatever is not done yet (nothing, once the sensor's runs are through).
say "orca backfill labels @all (keyed by the origins in lake.clean)"
"$BIN/orca" backfill labels @all
"$BIN/orca" keys labels
"${ORCA_TEST_PYTHON:-/var/tmp/orca-py/bin/python}" - "$READER_URL" "$ORCA_WAREHOUSE" <<'PY'
import sys
from pyiceberg.catalog.sql import SqlCatalog
url, wh = sys.argv[1].replace("postgres://", "postgresql+psycopg2://"), sys.argv[2]
t = SqlCatalog("default", uri=url, warehouse="file://" + wh).load_table("lake.labels")
for row in sorted(t.scan().to_arrow().to_pylist(), key=lambda r: r["origin"]):
    print("  ", row)
PY

say "a sync: table demo_orders mirrored into raw.orders (merge by id), run by the runner's orca-engine"
"${PSQL[@]}" -d orca -q <<SQL
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS raw CASCADE;
DROP TABLE IF EXISTS demo_orders;
CREATE TABLE demo_orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL,
                          customer text, total numeric(10,2));
INSERT INTO demo_orders SELECT g, '2024-01-01'::timestamptz + g * interval '1 minute',
                               'customer ' || (g % 97), g / 10.0
FROM generate_series(1, 50000) g;
-- Netguard refuses loopback addresses unless the org's allowlist permits
-- them (docs/security.md): this sync reads and writes this machine's cluster.
SELECT orca.allow('default', '127.0.0.1', note => 'the quick start: its sync is on this machine');
SELECT orca.create_sync('orders_mirror',
    jsonb_build_object('type', 'postgres', 'url', '$DATABASE_URL', 'batch_rows', 10000),
    jsonb_build_object('type', 'postgres', 'url', '$DATABASE_URL', 'schema', 'raw'),
    '[{"name": "orders", "table": "public.demo_orders", "cursor": "updated_at",
       "primary_key": ["id"], "mode": "merge"}]',
    delivery => 'effectively_once');
SQL
sync_run() {
    local id
    id=$("${PSQL[@]}" -d orca -Atqc "SELECT orca.run('orders_mirror', 'now')")
    for ((i = 0; i < 240; i++)); do
        [ "$("${PSQL[@]}" -d orca -Atqc "SELECT status FROM orca.runs WHERE id = $id")" = succeeded ] && return 0
        sleep 0.25
    done
    tail -30 "$LOGS/runner.out" >&2
    die "sync run $id did not succeed within 60 s"
}
sync_run
"${PSQL[@]}" -d orca -Atqc "UPDATE demo_orders SET total = total + 1, updated_at = now() WHERE id <= 100"
say "orca sync orders_mirror (reads the 100 updated rows)"
"$BIN/orca" sync orders_mirror
"$BIN/orca" syncs
"$BIN/orca" runs --pipeline orders_mirror
"${PSQL[@]}" -d orca -c "SELECT count(*) AS rows, sum(total) AS total FROM raw.orders" \
    -c "SELECT count(*) AS rows, sum(total) AS total FROM demo_orders" \
    -c "SELECT sync, stream, epoch, generation FROM raw._orca_markers"

say "waiting for onthisday's schedule (* * * * *) to fire: the background worker ticks every second"
for ((i = 0; i < 180; i++)); do
    [ "$("${PSQL[@]}" -d orca -Atqc "SELECT EXISTS (SELECT 1 FROM orca.runs WHERE trigger = 'schedule' AND status = 'succeeded')")" = t ] && break
    sleep 0.5
done
"${PSQL[@]}" -d orca -Atqc "SELECT EXISTS (SELECT 1 FROM orca.runs WHERE trigger = 'schedule' AND status = 'succeeded')" | grep -q t ||
    { tail -30 "$LOGS/runner.out" >&2; die "the schedule did not fire within 90 s"; }
"$BIN/orca" runs --pipeline onthisday
"${PSQL[@]}" -d orca -c "SELECT kind, count(*) FROM orca.events GROUP BY kind ORDER BY min(id)"

stop_runner
trap - EXIT

# The console and the HTTP API, with a key to log in with.
SERVE_ADDR="127.0.0.1:${ORCA_SERVE_PORT:-8080}"
serve_stop
mkdir -p "$ORCA_ROOT/.orca"
KEY="$("${PSQL[@]}" -d orca -Atqc "SELECT orca.create_api_key('demo-' || to_char(now(), 'YYYYMMDD-HH24MISS'), 'operator')")"
DATABASE_URL="$DATABASE_URL" nohup "$BIN/orca" serve --listen "$SERVE_ADDR" >"$LOGS/serve.out" 2>&1 &
echo $! >"$SERVE_PID"
for ((i = 0; i < 60; i++)); do
    curl -fsS "http://$SERVE_ADDR/healthz" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -fsS "http://$SERVE_ADDR/healthz" >/dev/null 2>&1 ||
    { tail -20 "$LOGS/serve.out" >&2; die "orca serve did not start on $SERVE_ADDR (ORCA_SERVE_PORT picks another port)"; }
curl -fsS -H "Authorization: Bearer $KEY" "http://$SERVE_ADDR/api/v1/session" >/dev/null ||
    die "orca serve refused the demo's key"
say "the console: http://$SERVE_ADDR/console/  (log in with the key $KEY)"
say "the HTTP API: http://$SERVE_ADDR/api/v1 (its OpenAPI document: /api/v1/openapi.json)"
say "done. Explore: psql '$DATABASE_URL', or $BIN/orca runs (stop the cluster and orca serve: scripts/demo.sh stop)"
if [ "${ORCA_DEMO_STOP:-0}" = 1 ]; then
    serve_stop
    cluster_stop
fi
