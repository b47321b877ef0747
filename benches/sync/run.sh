#!/usr/bin/env bash
# The sync benchmark: a table of ROWS rows (mixed types, default 1M) into
# Parquet by orca-engine (release build; over one connection and split over
# the machine's cores), by dlt (PyPI, its pyarrow backend), by DuckDB's
# Postgres scanner (PyPI duckdb and duckdb-ext-postgres, which ships the
# extension) and raw `COPY ... TO STDOUT (FORMAT binary)` as the ceiling, in
# one run on the same Postgres. Prints rows/s, MB/s (of binary COPY bytes)
# and ratios.
#
#   benches/sync/run.sh
#   ROWS=200000 benches/sync/run.sh
#   KEEP_WORK=1 benches/sync/run.sh   # keep the Parquet files each tool wrote (the path is printed)
#   benches/sync/run.sh cdc      # the postgres_cdc source into Postgres and Iceberg:
#                                # changes/s and latency
#   benches/sync/run.sh shapes   # tables of one kind of column each (wide text,
#                                # jsonb, numeric, arrays; SHAPE_ROWS, default
#                                # 500k; SHAPES=jsonb,arrays picks some), orca-engine
#                                # against DuckDB
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/env.sh"
cd "$ORCA_ROOT"
"$ORCA_ROOT/scripts/setup.sh" --tests >/dev/null  # wal_level = logical for the CDC figures

# The peers in a venv of their own (their dependencies pin versions the
# test venv does not need).
DLT_VENV="${DLT_VENV:-/var/tmp/orca-dlt-venv}"
if ! "$DLT_VENV/bin/python" -c 'import dlt, sqlalchemy, psycopg2, pyarrow, duckdb, duckdb_ext' \
    2>/dev/null; then
    say "installing dlt and DuckDB into $DLT_VENV"
    python3 -m venv "$DLT_VENV"
    "$DLT_VENV/bin/python" -m pip install -q "dlt[parquet,filesystem]==1.31.0" "sqlalchemy==2.1.9" \
        "psycopg2-binary==2.9.13" "duckdb==1.4.4" "duckdb-ext-postgres==1.4.4.20260205"
fi
cargo build --release -q -p orca-bench-sync
if [ "${1:-}" = cdc ]; then
    # The Iceberg destination's warehouse, fresh each run.
    export ORCA_WAREHOUSE="${ORCA_WAREHOUSE:-/var/tmp/orca-bench-cdc-warehouse}"
    rm -rf "$ORCA_WAREHOUSE"
    exec "$CARGO_TARGET_DIR/release/orca-bench-sync" cdc
fi
DLT_PYTHON="$DLT_VENV/bin/python" DLT_SCRIPT="$ORCA_ROOT/benches/sync/dlt_load.py" \
    DUCKDB_SCRIPT="$ORCA_ROOT/benches/sync/duckdb_load.py" \
    "$CARGO_TARGET_DIR/release/orca-bench-sync" "$@"
