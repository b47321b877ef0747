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
KIND_ACK, KIND_REQUEST, KIND_REPLY = 8, 9, 10
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


class HostHTTP:
    """The host's HTTP service (``ORCA_HOST_SOCKET``): the host makes the
    request to an address netguard checked, retries connection failures,
    429 and 502-504 (idempotent methods, or ``retry=True``), and returns the
    response. Prefer it to reaching a server yourself: the org's allowlist
    then holds for every request, redirects included (they are not
    followed: request the ``location`` again)."""

    def __init__(self):
        path = os.environ.get("ORCA_HOST_SOCKET")
        if not path:
            raise ConnectorError("ORCA_HOST_SOCKET is not set: this host offers no HTTP service")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rb")
        self._lock = threading.Lock()
        self._next = 0

    def request(self, method: str, url: str, headers: Optional[Dict[str, str]] = None,
                body: Optional[bytes] = None, retry: Optional[bool] = None,
                timeout_seconds: Optional[int] = None) -> Dict[str, Any]:
        """``{"status", "headers", "body": bytes, "attempts"}``; raises
        :class:`ConnectorError` with the host's reason (netguard's refusal
        among them)."""
        import base64
        with self._lock:
            self._next += 1
            req: Dict[str, Any] = {"id": self._next, "method": method, "url": url,
                                   "headers": headers or {}}
            if body is not None:
                req["body_base64"] = base64.b64encode(body).decode()
            if retry is not None:
                req["retry"] = retry
            if timeout_seconds is not None:
                req["timeout_seconds"] = timeout_seconds
            self._sock.sendall((json.dumps(req) + "\n").encode())
            line = self._file.readline()
        if not line:
            raise ConnectorError("the host closed its HTTP service")
        answer = json.loads(line)
        if "error" in answer:
            raise ConnectorError(f"{method} {url}: {answer['error']}")
        if "body_base64" in answer:
            answer["body"] = base64.b64decode(answer.pop("body_base64"))
        else:
            answer["body"] = (answer.get("body") or "").encode()
        return answer

    def get_json(self, url: str, headers: Optional[Dict[str, str]] = None) -> Any:
        """GET ``url`` and decode its JSON body; a status other than 2xx
        raises."""
        r = self.request("GET", url, headers)
        if not 200 <= r["status"] < 300:
            raise ConnectorError(f"GET {url}: HTTP {r['status']} after {r['attempts']} tries: "
                                 f"{r['body'][:200]!r}")
        return json.loads(r["body"])


class Fenced(Exception):
    """A commit or fence of a generation older than the destination's fence."""

    def __init__(self, fence: int):
        super().__init__(f"fenced by generation {fence}")
        self.fence = fence


class Destination:
    """A destination connector. Override ``name``, ``commits``, ``modes``,
    ``reaches``, and :meth:`fence`, :meth:`marker` and :meth:`commit` (and
    :meth:`open` to connect, :meth:`check` to test a config).

    The engine sends each epoch's rows of a stream and then asks to commit
    them; :meth:`commit` must make the rows and the stream's marker (the
    epoch) visible together when ``commits`` is "atomic", and must refuse
    (raise :class:`Fenced`) a generation older than the fence, in the same
    transaction. A commit of an epoch at or below the marker is answered as
    done without calling :meth:`commit` (a retry, or recovery applying
    again)."""

    name = "destination"
    #: "atomic": rows and marker become visible together (exactly once with
    #: an exact source); "at_least_once": a crash may deliver an epoch again.
    commits = "atomic"
    #: The write modes it takes: "append", "merge".
    modes: List[str] = ["append"]
    #: Config options that name servers, checked against the org's allowlist.
    reaches: List[str] = []

    def spec(self) -> Dict[str, Any]:
        return {"protocol": PROTOCOL, "name": self.name, "commits": self.commits,
                "modes": self.modes, "reaches": self.reaches}

    def check(self, config: Dict[str, Any]) -> None:
        """Raises if the config cannot work (default: nothing to check)."""

    def open(self, config: Dict[str, Any], streams: List[Dict[str, Any]]) -> None:
        """Called once per attempt: the config (secrets resolved) and the
        streams (``name``, ``mode``, ``primary_key``, ``config``)."""

    def fence(self, generation: int) -> int:
        """Raises the fence to ``generation`` and returns it; a fence already
        above it is returned as it is (the host then stops)."""
        raise NotImplementedError

    def marker(self, stream: str) -> int:
        """The last epoch committed to ``stream`` (0: none)."""
        raise NotImplementedError

    def commit(self, stream: str, epoch: int, generation: int, rows: "pa.Table",
               mode: str) -> None:
        """Makes ``rows`` and the marker ``epoch`` visible."""
        raise NotImplementedError


def _reply(sock: socket.socket, answer: Dict[str, Any]) -> None:
    sock.sendall(_frame(KIND_REPLY, 0, json.dumps(answer, default=str).encode()))


def _serve_write(dest: Destination, path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    pending: Dict[int, List["pa.RecordBatch"]] = {}
    streams: List[Dict[str, Any]] = []
    try:
        while True:
            try:
                head = sock.recv(HEADER.size, socket.MSG_PEEK)
            except OSError:
                return
            if not head:
                return  # the attempt is done with us
            length, kind, version, stream, _ = HEADER.unpack(_read_exact(sock, HEADER.size))
            payload = _read_exact(sock, length)
            if version != VERSION:
                raise ConnectorError(f"frame version {version}, this connector speaks {VERSION}")
            if kind == KIND_OPEN:
                plan = json.loads(payload)
                if plan.get("protocol") != PROTOCOL:
                    raise ConnectorError(f"the host speaks protocol {plan.get('protocol')}, "
                                         f"this connector {PROTOCOL}")
                streams = plan["streams"]
                dest.open(plan.get("config") or {}, streams)
                _reply(sock, {"ok": True})
            elif kind == KIND_BATCH:
                reader = pa.ipc.open_stream(payload)
                pending.setdefault(stream, []).extend(reader)
            elif kind == KIND_REQUEST:
                req = json.loads(payload)
                op = req.get("op")
                try:
                    if op == "fence":
                        g = int(req["generation"])
                        fence = dest.fence(g)
                        _reply(sock, {"ok": True} if fence <= g else
                               {"ok": False, "fenced": fence, "generation": g})
                    elif op == "marker":
                        _reply(sock, {"ok": True, "epoch": int(dest.marker(req["stream"]))})
                    elif op == "commit":
                        name, epoch = req["stream"], int(req["epoch"])
                        index = next(i for i, s in enumerate(streams) if s["name"] == name)
                        batches = pending.pop(index, [])
                        rows = pa.Table.from_batches(batches) if batches else None
                        n = rows.num_rows if rows is not None else 0
                        if epoch <= dest.marker(name):
                            _reply(sock, {"ok": True, "rows": n, "skipped": True})
                            continue
                        if rows is None:
                            rows = pa.table({})
                        dest.commit(name, epoch, int(req["generation"]), rows,
                                    req.get("mode") or "append")
                        _reply(sock, {"ok": True, "rows": n})
                    else:
                        _reply(sock, {"ok": False, "error": f"unknown request {op!r}"})
                except Fenced as f:
                    _reply(sock, {"ok": False, "fenced": f.fence,
                                  "generation": req.get("generation")})
                except Exception as e:
                    reason = str(e) if isinstance(e, ConnectorError) else \
                        f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
                    _reply(sock, {"ok": False, "error": reason})
            else:
                raise ConnectorError(f"the host sent a frame of kind {kind} to a destination")
    finally:
        sock.close()


def run(source, argv: Optional[List[str]] = None) -> None:
    """The connector program's entry point: ``PROGRAM spec|check|discover|read``
    for a :class:`Source`, ``PROGRAM spec|check|write`` for a
    :class:`Destination`. ``check`` and ``discover`` read the config as JSON
    on stdin."""
    argv = sys.argv[1:] if argv is None else argv
    verb = argv[0] if argv else ""
    try:
        if verb == "write" and isinstance(source, Destination):
            path = os.environ.get("ORCA_CONNECTOR_SOCKET")
            if not path:
                raise ConnectorError("ORCA_CONNECTOR_SOCKET is not set: the host starts write")
            _serve_write(source, path)
            return
        if verb == "spec":
            print(json.dumps(source.spec()))
        elif verb == "check" or (verb == "discover" and isinstance(source, Source)):
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
