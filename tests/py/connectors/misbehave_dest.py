"""A destination connector that breaks the protocol in the way its first
argument says, for the tests of how the engine takes it
(tests/tests/connectors.rs).

  misbehave_dest.py MODE spec|write
  MODE: crash    commits the first epoch, then exits 3 at the second
        hang     commits the first epoch, then never answers
        garbage  commits the first epoch, then answers with an unknown kind
        refuse   commits the first epoch, then refuses the second
        loose    its spec promises at_least_once commits only
        nomerge  its spec takes append only
Committed epochs are appended to $MISBEHAVE_DIR/MODE.jsonl as
{"stream", "epoch", "rows"}; its markers are read back from there.
"""
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "connectors", "python"))
import pyarrow as pa  # noqa: E402

from orca_connector import (HEADER, KIND_BATCH, KIND_OPEN, KIND_REPLY, KIND_REQUEST,  # noqa: E402
                            _frame, _read_exact)

mode, verb = sys.argv[1], sys.argv[2]
if verb == "spec":
    print(json.dumps({"protocol": 1, "name": "misbehave_dest",
                      "commits": "at_least_once" if mode == "loose" else "atomic",
                      "modes": ["append"] if mode == "nomerge" else ["append", "merge"]}))
    sys.exit(0)
log = os.path.join(os.environ["MISBEHAVE_DIR"], f"{mode}.jsonl")


def committed():
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def reply(answer):
    sock.sendall(_frame(KIND_REPLY, 0, json.dumps(answer).encode()))


sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["ORCA_CONNECTOR_SOCKET"])
rows = 0
while True:
    head = sock.recv(HEADER.size, socket.MSG_PEEK)
    if not head:
        sys.exit(0)
    length, kind, _, _, _ = HEADER.unpack(_read_exact(sock, HEADER.size))
    payload = _read_exact(sock, length)
    if kind == KIND_OPEN:
        reply({"ok": True})
    elif kind == KIND_BATCH:
        rows += pa.ipc.open_stream(payload).read_all().num_rows
    elif kind == KIND_REQUEST:
        req = json.loads(payload)
        if req["op"] == "fence":
            reply({"ok": True})
        elif req["op"] == "marker":
            mine = [c["epoch"] for c in committed() if c["stream"] == req["stream"]]
            reply({"ok": True, "epoch": max(mine, default=0)})
        elif req["op"] == "commit":
            if committed():
                if mode == "crash":
                    print("misbehave_dest: the disk fell over", file=sys.stderr)
                    sys.stderr.flush()
                    os._exit(3)
                if mode == "hang":
                    time.sleep(600)
                if mode == "garbage":
                    sock.sendall(HEADER.pack(2, 42, 1, 0, 0) + b"{}")
                    time.sleep(2)
                    sys.exit(0)
                if mode == "refuse":
                    reply({"ok": False, "error": "quota exceeded for this stream"})
                    rows = 0
                    continue
            with open(log, "a") as f:
                f.write(json.dumps({"stream": req["stream"], "epoch": req["epoch"],
                                    "rows": rows}) + "\n")
            reply({"ok": True, "rows": rows})
            rows = 0
