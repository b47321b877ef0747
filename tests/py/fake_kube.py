"""A stand-in for kube-apiserver's pod API (a simulation: no Kubernetes API
server can be installed on the test machine), for the pod launcher's test.

    python3 fake_kube.py DIR

It serves create, read and delete of pods in any namespace as the API does
(the Pod object with metadata the server fills in; a Status object with 404
or 409), on a free loopback port written to DIR/port. It records the
conversation: each request as a line of DIR/requests.log, each created pod
as DIR/pods/NAME.json. A pod's status is what the test writes to
DIR/status/NAME.json (else Pending), as a kubelet would report it.
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
for sub in ("pods", "status"):
    os.makedirs(os.path.join(DIR, sub), exist_ok=True)
LOCK = threading.Lock()
PODS = {}
ONE = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/?]+)(\?.*)?$")
ALL = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(\?.*)?$")


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

    def with_status(self, pod):
        name = pod["metadata"]["name"]
        path = os.path.join(DIR, "status", name + ".json")
        out = dict(pod)
        out["status"] = {"phase": "Pending"}
        if os.path.exists(path):
            with open(path) as f:
                out["status"] = json.load(f)
        return out

    def do_POST(self):
        self.record()
        m = ALL.match(self.path)
        if not m:
            return self.answer(404, status_object(404, "NotFound", "the server could not find the requested resource"))
        pod = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        name = pod["metadata"]["name"]
        with LOCK:
            if name in PODS:
                return self.answer(409, status_object(409, "AlreadyExists", f'pods "{name}" already exists'))
            pod["metadata"].update({
                "namespace": m.group(1),
                "uid": str(uuid.uuid4()),
                "resourceVersion": "1",
                "creationTimestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            })
            PODS[name] = pod
            with open(os.path.join(DIR, "pods", name + ".json"), "w") as f:
                json.dump(pod, f)
        self.answer(201, self.with_status(pod))

    def do_GET(self):
        self.record()
        m = ONE.match(self.path)
        with LOCK:
            pod = PODS.get(m.group(2)) if m else None
        if pod is None:
            name = m.group(2) if m else "?"
            return self.answer(404, status_object(404, "NotFound", f'pods "{name}" not found'))
        self.answer(200, self.with_status(pod))

    def do_DELETE(self):
        self.record()
        m = ONE.match(self.path)
        with LOCK:
            pod = PODS.pop(m.group(2), None) if m else None
        if pod is None:
            name = m.group(2) if m else "?"
            return self.answer(404, status_object(404, "NotFound", f'pods "{name}" not found'))
        self.answer(200, self.with_status(pod))


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(os.path.join(DIR, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(DIR, "port.tmp"), os.path.join(DIR, "port"))
server.serve_forever()
