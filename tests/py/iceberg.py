"""Another Iceberg client, for the tests: PyIceberg's SqlCatalog over the same
Postgres tables Orca's catalog writes.

    python iceberg.py read    <db-url> <warehouse> <dataset>   -> JSON: schema, rows, snapshots
    python iceberg.py append  <db-url> <warehouse> <dataset> <json rows> [summary json]
    python iceberg.py create  <db-url> <warehouse> <dataset> <json rows>
    python iceberg.py overwrite <db-url> <warehouse> <dataset> <json rows>
    python iceberg.py evolve <db-url> <warehouse> <dataset> <json changes>
                                                changes: [["rename", old, new], ["drop", name],
                                                ["add", name, "string" | "long"]], in order
    python iceberg.py stats   <db-url> <warehouse> <dataset> <int column>
                                                -> JSON: rows, distinct, sum, snapshots
    python iceberg.py prune   <db-url> <warehouse> <dataset> <column> <value>
                                                -> JSON: the table's partition spec, and
                                                   the files and rows PyIceberg and DuckDB
                                                   read for column = value, and in all
"""
import json
import os
import sys

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog


def catalog(url, warehouse):
    # The catalog name is the org (ORCA_TEST_CATALOG, else default).
    name = os.environ.get("ORCA_TEST_CATALOG", "default")
    url = url.replace("postgres://", "postgresql+psycopg2://", 1)
    if warehouse.startswith("s3://"):
        # The same S3 settings the pipeline binaries read from AWS_*.
        props = {
            "s3.endpoint": os.environ.get("AWS_ENDPOINT", ""),
            "s3.access-key-id": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "s3.secret-access-key": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
        }
        return SqlCatalog(name, uri=url, warehouse=warehouse, **props)
    endpoint = os.environ.get("ORCA_TEST_STORE_ENDPOINT", "")
    if warehouse.startswith(("abfs://", "abfss://")):
        # azurite's well-known account, through pyarrow's AzureFileSystem.
        authority = endpoint.split("://", 1)[-1]
        props = {
            "adls.account-name": "devstoreaccount1",
            "adls.account-key": "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
            "adls.blob-storage-authority": authority,
            "adls.dfs-storage-authority": authority,
            "adls.blob-storage-scheme": "http",
            "adls.dfs-storage-scheme": "http",
            "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
        }
        return SqlCatalog(name, uri=url, warehouse=warehouse, **props)
    return SqlCatalog(name, uri=url, warehouse="file://" + warehouse)


def duckdb_files(metadata, column, value):
    """What DuckDB's Iceberg extension reads of a table for column = value:
    the files its profile says it read, and the rows it counted. The
    extension comes from PyPI's duckdb-ext-iceberg: nothing is downloaded."""
    import glob
    import re

    import duckdb
    import duckdb_ext

    d = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    for e in ["avro", "iceberg"]:
        con.execute(f"LOAD '{glob.glob(os.path.join(d, '*', '*', e + '.duckdb_extension'))[0]}'")
    path = metadata.removeprefix("file://")
    q = f"SELECT count(*) FROM iceberg_scan('{path}') WHERE {column} = ?"
    rows = con.execute(q, [value]).fetchone()[0]
    plan = "\n".join(r[1] for r in con.execute("EXPLAIN ANALYZE " + q, [value]).fetchall())
    m = re.search(r"Total Files Read: (\d+)", plan)
    every = "\n".join(r[1] for r in con.execute(
        f"EXPLAIN ANALYZE SELECT count(*) FROM iceberg_scan('{path}')").fetchall())
    n = re.search(r"Total Files Read: (\d+)", every)
    return {"files": int(m.group(1)) if m else None,
            "all_files": int(n.group(1)) if n else None, "rows": rows}


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
            "properties": dict(t.properties),
        }
        print(json.dumps(out, default=str))
    elif cmd == "files":
        # The current snapshot's data files, each with its partition and the
        # values of one column in the file's own order.
        import pyarrow.parquet as pq
        column = sys.argv[5]
        t = cat.load_table(dataset)
        out = {
            "sort_order": [[t.schema().find_column_name(f.source_id), str(f.direction)]
                           for f in t.sort_order().fields],
            "files": [],
        }
        for task in t.scan().plan_files():
            path = task.file.file_path.removeprefix("file://")
            out["files"].append({
                "partition": str(task.file.partition),
                "values": pq.read_table(path, columns=[column]).column(0).to_pylist(),
            })
        print(json.dumps(out, default=str))
    elif cmd == "prune":
        from pyiceberg.expressions import EqualTo
        column, value = sys.argv[5:7]
        t = cat.load_table(dataset)
        hit = t.scan(row_filter=EqualTo(column, value))
        out = {
            "spec": [[f.name, str(f.transform)] for f in t.spec().fields],
            "pyiceberg": {
                "files": len(list(hit.plan_files())),
                "all_files": len(list(t.scan().plan_files())),
                "rows": hit.to_arrow().num_rows,
            },
            "duckdb": duckdb_files(t.metadata_location, column, value),
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
    elif cmd == "evolve":
        # Schema evolution as another engine makes it: columns keep their
        # field ids across a rename; a column added takes a new id.
        from pyiceberg.types import LongType, StringType
        t = cat.load_table(dataset)
        types = {"string": StringType(), "long": LongType()}
        for change in json.loads(sys.argv[5]):
            with t.update_schema() as u:
                if change[0] == "rename":
                    u.rename_column(change[1], change[2])
                elif change[0] == "drop":
                    u.delete_column(change[1])
                elif change[0] == "add":
                    u.add_column(change[1], types[change[2]])
                else:
                    sys.exit(f"unknown schema change {change}")
        t = cat.load_table(dataset)
        print(json.dumps({"schema": [[f.field_id, f.name, str(f.field_type)]
                                     for f in t.schema().fields]}))
    elif cmd == "overwrite":
        # Replaces every row: an overwrite snapshot.
        t = cat.load_table(dataset)
        data = pa.Table.from_pylist(json.loads(sys.argv[5]))
        data = data.select(t.schema().as_arrow().names).cast(t.schema().as_arrow())
        t.overwrite(data)
        print(json.dumps({"snapshot": t.current_snapshot().snapshot_id}))
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
