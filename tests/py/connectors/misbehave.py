"""A connector that breaks the protocol in the way its first argument says,
for the tests of how a host takes it (tests/tests/connectors.rs).

  misbehave.py MODE spec|read
  MODE: garbage   one good chunk, then a frame of an unknown version
        hang      one good chunk, then nothing (a hung source)
        crash     one good chunk, then exit 3 with a word on stderr
        outofturn the second stream's chunk before the first's
        noconnect exit 4 without connecting
        wrongcols a batch whose columns are not raw records
        acks      a well-behaved connector (package-built) of 40 records in
                  chunks of batch_rows that logs each acknowledgement
Every read also appends a line to $MISBEHAVE_LOG, if set.
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "connectors", "python"))
import pyarrow as pa  # noqa: E402

from orca_connector import (HEADER, KIND_BARRIER, KIND_BATCH, KIND_OPEN, _batch_payload,  # noqa: E402
                            _frame, _read_exact)

mode, verb = sys.argv[1], sys.argv[2]
if verb == "spec":
    print(json.dumps({"protocol": 1, "name": "misbehave", "replay": "exact",
                      "reaches": ["servers"]}))
    sys.exit(0)
if os.environ.get("MISBEHAVE_LOG"):
    with open(os.environ["MISBEHAVE_LOG"], "a") as f:
        f.write(f"{mode} read\n")
if mode == "acks":
    from orca_connector import Source, run

    class Acks(Source):
        name = "acks"
        replay = "exact"

        def read(self, config, stream, after):
            start = int(after[0]) + 1 if after else 1
            for i in range(start, 41):
                yield {"id": i}, [str(i)]

        def acknowledge(self, stream, position):
            with open(os.environ["MISBEHAVE_LOG"], "a") as f:
                f.write(f"ack {stream} {position[0]}\n")

    run(Acks(), [verb])
    sys.exit(0)
if mode == "noconnect":
    print("misbehave: refusing to connect", file=sys.stderr)
    sys.exit(4)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["ORCA_CONNECTOR_SOCKET"])
length, kind, _, _, _ = HEADER.unpack(_read_exact(sock, HEADER.size))
assert kind == KIND_OPEN
plan = json.loads(_read_exact(sock, length))
rows = [(str(i), json.dumps({"id": i})) for i in range(1, 4)]


def chunk(stream):
    sock.sendall(_frame(KIND_BATCH, stream, _batch_payload(rows)))
    sock.sendall(_frame(KIND_BARRIER, stream, json.dumps(["3"]).encode()))


if mode == "outofturn":
    chunk(1)
elif mode == "wrongcols":
    schema = pa.schema([pa.field("id", pa.int64())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch([pa.array([1, 2])], schema=schema))
    sock.sendall(_frame(KIND_BATCH, 0, sink.getvalue().to_pybytes()))
else:
    chunk(0)
if mode == "garbage":
    sock.sendall(HEADER.pack(5, 1, 7, 0, 0) + b"xxxxx")
elif mode == "hang":
    time.sleep(600)
elif mode == "crash":
    print("misbehave: the source fell over", file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)
time.sleep(2)
