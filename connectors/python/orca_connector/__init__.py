"""Write an Orca external connector as a Python class.

A connector is a program in a runner's connectors directory
(``orca-runner --connectors DIR``) that a sync names as its source::

    {"type": "connector", "connector": "nats_jetstream", "replay": "exact",
     "config": {"servers": "nats://127.0.0.1:4222"}}

Subclass :class:`Source`, say what a read again returns (``replay``) and
which config options name servers (``reaches``, checked against the org's
allowlist before the connector starts), implement :meth:`Source.discover`
and :meth:`Source.read`, and end the program with ``run(MySource())``. The
host calls it as ``PROGRAM spec|check|discover|read``; docs/connectors.md
has the protocol this module speaks for you.
"""
import json
import os
import socket
import struct
import sys
import threading
import traceback
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pyarrow as pa

PROTOCOL = 1
VERSION = 1
HEADER = struct.Struct("<IBBHI")
KIND_BATCH, KIND_BARRIER, KIND_END, KIND_OPEN, KIND_ERROR = 1, 2, 3, 4, 5
KIND_ACK = 8
ANY_STREAM = 0xFFFF
RAW_SCHEMA = pa.schema([
    pa.field("position", pa.string(), nullable=False),
    pa.field("record", pa.string(), nullable=False),
    pa.field("error", pa.string(), nullable=True),
])

Record = Dict[str, Any]
Position = List[str]


class ConnectorError(Exception):
    """A failure the connector explains; the attempt fails with its text."""


class Source:
    """A source connector. Override ``name``, ``replay``, ``reaches``,
    :meth:`discover` and :meth:`read` (and :meth:`check` if a cheaper test
    of the config than a discover exists)."""

    name = "source"
    #: "exact": a read from a resume point returns the same records in the
    #: same order; "superset": at least them (possibly newer versions).
    replay = "superset"
    #: Config options (of the source's or a stream's config) that name
    #: servers: "host:port", URLs, or lists of them.
    reaches: List[str] = []

    def spec(self) -> Dict[str, Any]:
        return {"protocol": PROTOCOL, "name": self.name, "replay": self.replay,
                "reaches": list(self.reaches)}

    def check(self, config: Dict[str, Any]) -> None:
        """Raises if the config cannot work (default: a discover)."""
        self.discover(config)

    def discover(self, config: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The streams the source has: ``[{"name": ..., "config": {...}}]``."""
        raise NotImplementedError

    def read(self, config: Dict[str, Any], stream: Dict[str, Any],
             after: Optional[Position]) -> Iterator[Tuple[Record, Position]]:
        """Yields ``(record, position)`` for every record after ``after``
        (None: from the start), in order, until the source has no more for
        now. ``position`` is the resume point after the record: a list of
        strings that ``read`` understands as ``after`` next time.
        ``stream`` is ``{"name", "config"}`` from the sync's definition."""
        raise NotImplementedError

    def acknowledge(self, stream: str, position: Position) -> None:
        """Called (on another thread) once a committed checkpoint holds
        every record of ``stream`` up to ``position``: a source that must
        confirm upstream what it delivered (a queue's ack, a durable
        consumer's sequence) does it here, never before. Acknowledgements
        come one checkpoint behind and are cumulative; the next attempt's
        ``after`` acknowledges everything before it too."""


def _frame(kind: int, stream: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), kind, VERSION, stream, 0) + payload


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectorError("the host closed the socket")
        buf.extend(part)
    return bytes(buf)


def _batch_payload(rows: List[Tuple[str, str]]) -> bytes:
    batch = pa.record_batch([
        pa.array([p for p, _ in rows], pa.string()),
        pa.array([r for _, r in rows], pa.string()),
        pa.nulls(len(rows), pa.string()),
    ], schema=RAW_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, RAW_SCHEMA) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _take_acks(source: Source, sock: socket.socket) -> None:
    """Hands the host's ack frames to ``source.acknowledge`` until the
    socket closes."""
    try:
        while True:
            length, kind, _, _, _ = HEADER.unpack(_read_exact(sock, HEADER.size))
            payload = _read_exact(sock, length)
            if kind == KIND_ACK:
                for stream, position in json.loads(payload).items():
                    source.acknowledge(stream, position)
    except (ConnectorError, OSError):
        return


def _serve(source: Source, path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    length, kind, version, _, _ = HEADER.unpack(_read_exact(sock, HEADER.size))
    if kind != KIND_OPEN or version != VERSION:
        raise ConnectorError(f"the host's first frame is kind {kind} version {version}, "
                             "not an open frame")
    plan = json.loads(_read_exact(sock, length))
    if plan.get("protocol") != PROTOCOL:
        raise ConnectorError(f"the host speaks protocol {plan.get('protocol')}, "
                             f"this connector {PROTOCOL}")
    config = plan.get("config") or {}
    acker = threading.Thread(target=_take_acks, args=(source, sock), daemon=True)
    acker.start()
    batch_rows = max(1, int(plan.get("batch_rows") or 10000))
    streams = plan["streams"]
    iters = [iter(source.read(config, {"name": s["name"], "config": s.get("config") or {}},
                              s.get("after")))
             for s in streams]
    open_streams = list(range(len(streams)))
    current = -1
    try:
        # A round of the streams at a time, in the open frame's order: each
        # stream's chunk (batches, then a barrier), or its end.
        while open_streams:
            for i in list(open_streams):
                current = i
                rows: List[Tuple[str, str]] = []
                last: Optional[Position] = None
                for record, position in iters[i]:
                    position = [str(p) for p in position]
                    rows.append((":".join(position), json.dumps(record, default=str)))
                    last = position
                    if len(rows) >= batch_rows:
                        break
                if rows:
                    sock.sendall(_frame(KIND_BATCH, i, _batch_payload(rows)))
                    sock.sendall(_frame(KIND_BARRIER, i, json.dumps(last).encode()))
                else:
                    sock.sendall(_frame(KIND_END, i, json.dumps({"bytes": 0}).encode()))
                    open_streams.remove(i)
        # Every stream ended: the host sends the attempt's last
        # acknowledgements, then closes the socket.
        acker.join()
    except Exception as e:  # the host fails the attempt with the reason
        reason = str(e) if isinstance(e, ConnectorError) else \
            f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
        sock.sendall(_frame(KIND_ERROR, current if current >= 0 else ANY_STREAM,
                            reason.encode()))
        raise
    finally:
        sock.close()


def run(source: Source, argv: Optional[List[str]] = None) -> None:
    """The connector program's entry point: ``PROGRAM spec|check|discover|read``.
    ``check`` and ``discover`` read the config as JSON on stdin."""
    argv = sys.argv[1:] if argv is None else argv
    verb = argv[0] if argv else ""
    try:
        if verb == "spec":
            print(json.dumps(source.spec()))
        elif verb in ("check", "discover"):
            config = json.loads(sys.stdin.read() or "{}")
            if verb == "check":
                try:
                    source.check(config)
                    print(json.dumps({"ok": True}))
                except Exception as e:
                    print(json.dumps({"ok": False, "error": str(e)}))
                    sys.exit(1)
            else:
                print(json.dumps({"streams": source.discover(config)}))
        elif verb == "read":
            path = os.environ.get("ORCA_CONNECTOR_SOCKET")
            if not path:
                raise ConnectorError("ORCA_CONNECTOR_SOCKET is not set: the host starts read")
            _serve(source, path)
        else:
            print(f"usage: {os.path.basename(sys.argv[0])} spec|check|discover|read",
                  file=sys.stderr)
            sys.exit(2)
    except ConnectorError as e:
        print(f"{source.name}: {e}", file=sys.stderr)
        sys.exit(1)
