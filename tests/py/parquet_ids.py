"""Another Parquet reader, for the tests: every .parquet file under a folder
(a local directory, or s3://bucket/prefix with the AWS_* settings the
runners use), read with pyarrow, and what its `id` column holds.

    python parquet_ids.py <folder>   -> JSON: files, rows, ids (distinct), min, max
"""
import json
import os
import sys

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def main():
    folder = sys.argv[1]
    if folder.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT", "")
        fs = pafs.S3FileSystem(
            access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            region=os.environ.get("AWS_REGION", "us-east-1"),
            endpoint_override=endpoint.split("://", 1)[-1] or None,
            scheme="http" if endpoint.startswith("http://") else "https",
        )
        root = folder[len("s3://"):]
    else:
        fs, root = pafs.LocalFileSystem(), folder
    files = sorted(
        f.path for f in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        if f.type == pafs.FileType.File and f.path.endswith(".parquet")
    )
    ids = []
    for path in files:
        ids.extend(pq.read_table(path, filesystem=fs, columns=["id"]).column("id").to_pylist())
    print(json.dumps({
        "files": len(files),
        "rows": len(ids),
        "ids": len(set(ids)),
        "min": min(ids) if ids else None,
        "max": max(ids) if ids else None,
    }))


if __name__ == "__main__":
    main()
