"""A stand-in for kube-apiserver's pod and secret API (a simulation: no
Kubernetes API server can be installed on the test machine), for the pod
launcher's test.

    python3 fake_kube.py DIR

It serves create, read, merge-patch and delete of pods and secrets in any
namespace as the API does (the object with metadata the server fills in; a
Status object with 404 or 409), on a free loopback port written to
DIR/port. It records the conversation: each request as a line of
DIR/requests.log, each created object as DIR/pods/NAME.json or
DIR/secrets/NAME.json (a patch rewrites it). A pod's status is what the
test writes to DIR/status/NAME.json (else Pending), as a kubelet would
report it.
"""

import datetime
import json
import os
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR = sys.argv[1]
for sub in ("pods", "secrets", "status"):
    os.makedirs(os.path.join(DIR, sub), exist_ok=True)
LOCK = threading.Lock()
OBJECTS = {"pods": {}, "secrets": {}}
ONE = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|secrets)/([^/?]+)(\?.*)?$")
ALL = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|secrets)(\?.*)?$")


def status_object(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def record(self):
        with LOCK, open(os.path.join(DIR, "requests.log"), "a") as f:
            f.write(f"{self.command} {self.path}\n")

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def shown(self, kind, obj):
        if kind != "pods":
            return obj
        name = obj["metadata"]["name"]
        path = os.path.join(DIR, "status", name + ".json")
        out = dict(obj)
        out["status"] = {"phase": "Pending"}
        if os.path.exists(path):
            with open(path) as f:
                out["status"] = json.load(f)
        return out

    def save(self, kind, obj):
        with open(os.path.join(DIR, kind, obj["metadata"]["name"] + ".json"), "w") as f:
            json.dump(obj, f)

    def not_found(self, kind, name):
        return self.answer(404, status_object(404, "NotFound", f'{kind} "{name}" not found'))

    def body(self):
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def do_POST(self):
        self.record()
        m = ALL.match(self.path)
        if not m:
            return self.answer(404, status_object(404, "NotFound", "the server could not find the requested resource"))
        kind, obj = m.group(2), self.body()
        name = obj["metadata"]["name"]
        with LOCK:
            if name in OBJECTS[kind]:
                return self.answer(409, status_object(409, "AlreadyExists", f'{kind} "{name}" already exists'))
            obj["metadata"].update({
                "namespace": m.group(1),
                "uid": str(uuid.uuid4()),
                "resourceVersion": "1",
                "creationTimestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            })
            OBJECTS[kind][name] = obj
            self.save(kind, obj)
        self.answer(201, self.shown(kind, obj))

    def do_GET(self):
        self.record()
        m = ONE.match(self.path)
        with LOCK:
            obj = OBJECTS[m.group(2)].get(m.group(3)) if m else None
        if obj is None:
            return self.not_found(m.group(2) if m else "pods", m.group(3) if m else "?")
        self.answer(200, self.shown(m.group(2), obj))

    def do_PATCH(self):
        self.record()
        m = ONE.match(self.path)
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self.answer(415, status_object(415, "UnsupportedMediaType", "only merge patches here"))
        patch = self.body()
        with LOCK:
            obj = OBJECTS[m.group(2)].get(m.group(3)) if m else None
            if obj is not None:
                # A merge patch of metadata, the one part the launcher patches.
                obj["metadata"].update(patch.get("metadata", {}))
                self.save(m.group(2), obj)
        if obj is None:
            return self.not_found(m.group(2) if m else "pods", m.group(3) if m else "?")
        self.answer(200, self.shown(m.group(2), obj))

    def do_DELETE(self):
        self.record()
        m = ONE.match(self.path)
        with LOCK:
            obj = OBJECTS[m.group(2)].pop(m.group(3), None) if m else None
        if obj is None:
            return self.not_found(m.group(2) if m else "pods", m.group(3) if m else "?")
        self.answer(200, self.shown(m.group(2), obj))


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(os.path.join(DIR, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(DIR, "port.tmp"), os.path.join(DIR, "port"))
server.serve_forever()
