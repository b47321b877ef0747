"""Another Iceberg client, for the tests: PyIceberg's SqlCatalog over the same
Postgres tables Orca's catalog writes.

    python iceberg.py read    <db-url> <warehouse> <dataset>   -> JSON: schema, rows, snapshots
    python iceberg.py append  <db-url> <warehouse> <dataset> <json rows> [summary json]
    python iceberg.py create  <db-url> <warehouse> <dataset> <json rows>
    python iceberg.py stats   <db-url> <warehouse> <dataset> <int column>
                                                -> JSON: rows, distinct, sum, snapshots
"""
import json
import os
import sys

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


def catalog(url, warehouse):
    url = url.replace("postgres://", "postgresql+psycopg2://", 1)
    if warehouse.startswith("s3://"):
        # The same S3 settings the pipeline binaries read from AWS_*.
        props = {
            "s3.endpoint": os.environ.get("AWS_ENDPOINT", ""),
            "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
        }
        return SqlCatalog("default", uri=url, warehouse=warehouse, **props)
    return SqlCatalog("default", uri=url, warehouse="file://" + warehouse)


def main():
    cmd, url, warehouse, dataset = sys.argv[1:5]
    cat = catalog(url, warehouse)
    if cmd == "read":
        t = cat.load_table(dataset)
        snaps = [
            {"id": s.snapshot_id, "parent": s.parent_snapshot_id,
             "operation": str(s.summary.operation.value) if s.summary else None,
             "summary": dict(s.summary.additional_properties) if s.summary else {}}
            for s in t.snapshots()
        ]
        out = {
            "schema": [[f.name, str(f.field_type), f.required] for f in t.schema().fields],
            "rows": t.scan().to_arrow().to_pylist(),
            "snapshots": snaps,
            "current": t.current_snapshot().snapshot_id if t.current_snapshot() else None,
            "location": t.location(),
        }
        print(json.dumps(out, default=str))
    elif cmd == "stats":
        import pyarrow.compute as pc
        t = cat.load_table(dataset)
        data = t.scan().to_arrow()
        col = data.column(sys.argv[5])
        out = {
            "schema": [[f.name, str(f.field_type), f.required] for f in t.schema().fields],
            "rows": data.num_rows,
            "distinct": pc.count_distinct(col).as_py(),
            "sum": pc.sum(col).as_py(),
            "snapshots": [dict(s.summary.additional_properties) if s.summary else {}
                          for s in t.snapshots()],
            "properties": dict(t.properties),
        }
        print(json.dumps(out, default=str))
    elif cmd in ("append", "create"):
        rows = json.loads(sys.argv[5])
        data = pa.Table.from_pylist(rows)
        ns = dataset.split(".")[0]
        if cmd == "create":
            try:
                cat.create_namespace(ns)
            except Exception:
                pass
            t = cat.create_table(dataset, schema=data.schema)
        else:
            t = cat.load_table(dataset)
            # The table's own types and nullability, as a writer of it would.
            data = data.select(t.schema().as_arrow().names).cast(t.schema().as_arrow())
        props = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
        t.append(data, snapshot_properties=props)
        print(json.dumps({"snapshot": t.current_snapshot().snapshot_id}))


if __name__ == "__main__":
    main()
