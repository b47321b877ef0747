"""A paginated JSON API for the HTTP connector's tests
(tests/tests/connectors.rs): GET /items?page=N answers
{"items": [...], "next": URL or null}, the first request of every page with
a 503 (Retry-After: 0), so that a client that does not retry fails.

  pages_server.py PORT_FILE ITEMS PER_PAGE LOG [--evil]

--evil: the last page's next link points at the cloud metadata address.
Each request is appended to LOG as "page N STATUS".
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

port_file, total, per_page, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
evil = "--evil" in sys.argv
seen = set()


class Pages(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        u = urlparse(self.path)
        page = int(parse_qs(u.query).get("page", ["1"])[0])
        if u.path != "/items":
            self.send_response(404)
            self.end_headers()
            return
        status = 200
        if page not in seen:
            seen.add(page)
            status = 503
        with open(log, "a") as f:
            f.write(f"page {page} {status}\n")
        if status == 503:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        first = (page - 1) * per_page + 1
        items = [{"id": i, "name": f"item {i}"} for i in range(first, min(first + per_page, total + 1))]
        pages = (total + per_page - 1) // per_page
        host = self.headers.get("Host")
        nxt = f"http://{host}/items?page={page + 1}" if page < pages else None
        if evil and page == pages:
            nxt = "http://169.254.169.254/latest/meta-data/?page=99"
        body = json.dumps({"items": items, "next": nxt}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
