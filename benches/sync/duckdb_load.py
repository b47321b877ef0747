"""DuckDB's side of benches/sync: the same table into a Parquet file through
DuckDB's Postgres scanner, which splits a table's read by ctid ranges over
several connections (one per DuckDB thread).

Usage: python duckdb_load.py URL TABLE OUT_DIR
Prints {"seconds": ..., "rows": ..., "duckdb": ..., "threads": ...}; the
time covers ATTACH and the COPY to Parquet, not interpreter start, imports
or loading the extension. The extension comes from PyPI's
duckdb-ext-postgres package, so nothing is downloaded at run time.
"""
import glob
import json
import os
import sys
import time
from urllib.parse import urlparse

import duckdb
import duckdb_ext

url, table, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
ext = glob.glob(os.path.join(list(duckdb_ext.__path__)[0], "extensions", "v*",
                             "*", "postgres_scanner.duckdb_extension"))
if not ext:
    sys.exit("duckdb-ext-postgres ships no postgres_scanner.duckdb_extension")
u = urlparse(url)
dsn = " ".join(f"{k}={v}" for k, v in [("host", u.hostname), ("port", u.port or 5432),
                                        ("user", u.username or "postgres"),
                                        ("dbname", u.path.lstrip("/"))] if v)
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
con.execute(f"LOAD '{ext[0]}'")
threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
target = os.path.join(out, f"{table}.parquet")
started = time.perf_counter()
con.execute(f"ATTACH '{dsn}' AS pg (TYPE postgres, READ_ONLY)")
con.execute(f"COPY (SELECT * FROM pg.public.{table}) TO '{target}' (FORMAT parquet)")
seconds = time.perf_counter() - started
rows = con.execute(f"SELECT count(*) FROM read_parquet('{target}')").fetchone()[0]
print(json.dumps({"seconds": seconds, "rows": rows, "duckdb": duckdb.__version__,
                  "threads": threads}))
