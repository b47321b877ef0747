"""DuckDB's side of benches/sync: the same table into a Parquet file through
DuckDB's Postgres scanner, which splits a table's read by ctid ranges over
several connections (one per DuckDB thread).

Usage: python duckdb_load.py URL TABLE OUT_DIR
Prints {"seconds": ..., "rows": ..., "duckdb": ..., "threads": ..., "busy":
..., "own": ..., "postgres": ...}; the time covers ATTACH and the COPY to Parquet, not
interpreter start, imports or loading the extension; "busy" is the cores the
machine kept busy over that time (from /proc/stat), "own" the cores this
process used, "postgres" the cores the Postgres server's processes used. The extension comes from PyPI's
duckdb-ext-postgres package, so nothing is downloaded at run time.
"""
import glob
import json
import os
import resource
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


def machine_ticks():
    """Busy and all clock ticks of the machine, every core summed."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def postgres_ticks():
    """CPU ticks of every process named postgres (the postmaster's count
    of its ended children included), as the Rust side reads them."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        if name == "postgres":
            total += sum(int(v) for v in text[text.rfind(")") + 2:].split()[11:15])
    return total


def own_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


busy0, total0 = machine_ticks()
own0 = own_seconds()
pg0 = postgres_ticks()
started = time.perf_counter()
con.execute(f"ATTACH '{dsn}' AS pg (TYPE postgres, READ_ONLY)")
con.execute(f"COPY (SELECT * FROM pg.public.{table}) TO '{target}' (FORMAT parquet)")
seconds = time.perf_counter() - started
own = (own_seconds() - own0) / seconds
pg = max(postgres_ticks() - pg0, 0) / 100 / seconds
busy1, total1 = machine_ticks()
busy = (busy1 - busy0) / max(total1 - total0, 1) * (os.cpu_count() or 1)
rows = con.execute(f"SELECT count(*) FROM read_parquet('{target}')").fetchone()[0]
print(json.dumps({"seconds": seconds, "rows": rows, "duckdb": duckdb.__version__,
                  "threads": threads, "busy": round(busy, 2), "own": round(own, 2),
                  "postgres": round(pg, 2)}))
