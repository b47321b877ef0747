"""A webhook endpoint for the tests: verifies each delivery with the
official Standard Webhooks library and records what it accepted.

    python webhook_receiver.py serve  <port> <secret> <dir> [fail_first]
        Answers 500 to the first fail_first deliveries (counted across
        restarts, in <dir>/seen), then verifies each one and answers 204, or
        401 if it does not verify. Appends each accepted delivery's event id
        to <dir>/accepted and keeps the first one whole in <dir>/sample.json.
    python webhook_receiver.py verify <secret> <sample.json> <what>
        Verifies the sample again after changing it: what = as-is, body
        (a byte of the body changed) or old (the timestamp ten minutes back,
        signed again); prints "ok" or "refused: <reason>".
"""
import hmac
import base64
import hashlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def count(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return 0


def serve(port, secret, directory, fail_first):
    hook = Webhook(secret)
    seen_path = os.path.join(directory, "seen")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("content-length", 0))
            body = self.rfile.read(length)
            seen = count(seen_path) + 1
            with open(seen_path, "w") as f:
                f.write(str(seen))
            if seen <= fail_first:
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"failing on purpose")
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                payload = hook.verify(body, headers)
            except WebhookVerificationError as e:
                self.send_response(401)
                self.end_headers()
                self.wfile.write(str(e).encode())
                return
            sample = os.path.join(directory, "sample.json")
            if not os.path.exists(sample):
                with open(sample, "w") as f:
                    json.dump({"headers": headers, "body": body.decode()}, f)
            with open(os.path.join(directory, "accepted"), "a") as f:
                f.write("%s %s\n" % (payload["data"]["event"], payload["type"]))
            self.send_response(204)
            self.end_headers()

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def sign(secret, msg_id, timestamp, body):
    key = base64.b64decode(secret[len("whsec_"):])
    mac = hmac.new(key, ("%s.%s.%s" % (msg_id, timestamp, body)).encode(), hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def verify(secret, sample_path, what):
    with open(sample_path) as f:
        sample = json.load(f)
    headers, body = dict(sample["headers"]), sample["body"]
    if what == "body":
        body = body.replace("\"", "'", 1)
    elif what == "old":
        old = int(headers["webhook-timestamp"]) - 600
        headers["webhook-timestamp"] = str(old)
        headers["webhook-signature"] = sign(secret, headers["webhook-id"], old, body)
    try:
        Webhook(secret).verify(body.encode(), headers)
        print("ok")
    except WebhookVerificationError as e:
        print("refused: %s" % e)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        fail = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4], fail)
    elif sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("usage: webhook_receiver.py serve|verify ...")
