"""dlt's side of benches/sync: the same table into Parquet files.

Usage: python dlt_load.py URL TABLE OUT_DIR [BACKEND]
Prints {"seconds": ..., "rows": ...}; the time covers pipeline.run() only
(extract, normalize and load), not interpreter start or imports, as the Orca
figure leaves out process start.
"""
import json
import os
import sys
import time

import dlt
from dlt.sources.sql_database import sql_table

url, table, out = sys.argv[1:4]
backend = sys.argv[4] if len(sys.argv) > 4 else "pyarrow"
os.makedirs(out, exist_ok=True)
pipeline = dlt.pipeline(
    pipeline_name=f"bench_{os.getpid()}",
    destination=dlt.destinations.filesystem(bucket_url=f"file://{out}/data"),
    dataset_name="bench",
    pipelines_dir=f"{out}/_pipelines",
)
source = sql_table(
    credentials=url.replace("postgres://", "postgresql+psycopg2://", 1),
    table=table,
    backend=backend,
    chunk_size=100_000,
)
started = time.perf_counter()
pipeline.run(source, loader_file_format="parquet")
seconds = time.perf_counter() - started
rows = pipeline.last_trace.last_normalize_info.row_counts.get(table, 0)
print(json.dumps({"seconds": seconds, "rows": rows, "backend": backend, "dlt": dlt.__version__}))
