"""DuckDB's side of benches/lake: the same monthly aggregation, for each of
the 24 months, over the same Iceberg table (bench.raw, partitioned by
month), through DuckDB's Iceberg extension from PyPI (duckdb-ext-iceberg:
nothing is downloaded at run time).

Usage: python duckdb_monthly.py DB_URL WAREHOUSE
Prints {"seconds": ..., "rows": ..., "peak_mib": ..., "threads": ...}; the
time covers the 24 queries, not interpreter start or loading the extension.
"""
import glob
import json
import os
import resource
import sys
import time

import duckdb
import duckdb_ext
from pyiceberg.catalog.sql import SqlCatalog

url, warehouse = sys.argv[1:3]
cat = SqlCatalog("default", uri=url.replace("postgres://", "postgresql+psycopg2://", 1),
                 warehouse="file://" + warehouse)
metadata = cat.load_table("bench.raw").metadata_location.removeprefix("file://")
d = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
con = duckdb.connect(config={"autoinstall_known_extensions": False,
                             "autoload_known_extensions": False})
for e in ["avro", "iceberg"]:
    con.execute(f"LOAD '{glob.glob(os.path.join(d, '*', '*', e + '.duckdb_extension'))[0]}'")
threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
months = [f"{y}-{m:02d}" for y in (2013, 2014) for m in range(1, 13)]
started = time.perf_counter()
out = 0
for month in months:
    out += len(con.execute(
        f"SELECT month, origin, carrier, count(*) AS flights, avg(dep_delay) AS avg_dep_delay, "
        f"sum(distance) AS miles FROM iceberg_scan('{metadata}') WHERE month = ? "
        f"GROUP BY month, origin, carrier", [month]).fetchall())
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"seconds": round(seconds, 2), "rows": out, "peak_mib": peak, "threads": threads}))
