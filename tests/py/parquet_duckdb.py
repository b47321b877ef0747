"""What DuckDB makes of a folder's Parquet files, for the tests: a column's
type as DuckDB reads it, and the `id` of each row whose column equals a
value (given as text, cast to that type; for a BLOB, its hex).

    python parquet_duckdb.py <folder> <column> <value>  -> JSON: type, ids
"""
import json
import os
import sys

import duckdb


def main():
    folder, column, value = sys.argv[1:4]
    files = os.path.join(folder, "**", "*.parquet")
    con = duckdb.connect()
    source = f"read_parquet('{files}')"
    kind = con.execute(f'SELECT typeof("{column}") FROM {source} LIMIT 1').fetchone()[0]
    if kind == "BLOB":
        match = f'hex("{column}") = upper(?)'
    else:
        match = f'"{column}" = CAST(? AS {kind})'
    ids = [r[0] for r in con.execute(
        f"SELECT id FROM {source} WHERE {match} ORDER BY id", [value]).fetchall()]
    print(json.dumps({"type": kind, "ids": ids}))


if __name__ == "__main__":
    main()
