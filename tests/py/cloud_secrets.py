"""A stand-in for GCP Secret Manager and Azure Key Vault and their token
endpoints, for the secrets test: no cloud is reachable from CI and neither
service has an emulator on the registries here. It speaks the parts of
their HTTP APIs Orca's clients use, and checks what the real ones check:

- Google's OAuth 2.0 token endpoint (POST /token): a JWT bearer grant whose
  assertion is RS256-signed by the service account key this script made
  (its public half verifies it), issued by its client_email, for this
  endpoint, with the cloud-platform scope, not expired;
- Secret Manager's versions.access (GET /v1/projects/P/secrets/S/versions/V:access)
  with a token it issued;
- Azure AD's client-credentials grant (POST /<tenant>/oauth2/v2.0/token) for
  the one client id and secret, scope https://vault.azure.net/.default;
- Key Vault's Get Secret (GET /kv/<vault>/secrets/<name>?api-version=7.4)
  with a token it issued.

    python cloud_secrets.py <port> <secrets.json> <service-account-key-out.json>

secrets.json: {"gcp": {"projects/p/secrets/s": "value"}, "azure": {"vault/name": "value"},
"azure_client": ["id", "secret", "tenant"]}. GET /_requests lists the paths asked for.
"""
import base64
import json
import secrets as rnd
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

PORT = int(sys.argv[1])
DATA = json.load(open(sys.argv[2]))
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EMAIL = "orca-runner@shop-prod.iam.gserviceaccount.com"
TOKEN_URI = f"http://127.0.0.1:{PORT}/token"
with open(sys.argv[3], "w") as f:
    json.dump({
        "type": "service_account",
        "project_id": "shop-prod",
        "private_key_id": "k1",
        "private_key": KEY.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode(),
        "client_email": EMAIL,
        "token_uri": TOKEN_URI,
    }, f)
TOKENS = {}
REQUESTS = []


def b64d(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def form(self):
        n = int(self.headers.get("content-length", 0))
        return dict(urllib.parse.parse_qsl(self.rfile.read(n).decode()))

    def bearer(self, cloud):
        auth = self.headers.get("authorization", "")
        return auth.startswith("Bearer ") and TOKENS.get(auth[7:]) == cloud

    def issue(self, cloud):
        t = rnd.token_urlsafe(24)
        TOKENS[t] = cloud
        self.reply(200, {"access_token": t, "expires_in": 3600, "token_type": "Bearer"})

    def do_POST(self):
        path = urllib.parse.urlparse(self.path).path
        REQUESTS.append("POST " + path)
        f = self.form()
        if path == "/token":
            try:
                assert f["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
                head, claims, sig = f["assertion"].split(".")
                KEY.public_key().verify(b64d(sig), f"{head}.{claims}".encode(),
                                        padding.PKCS1v15(), hashes.SHA256())
                h, c = json.loads(b64d(head)), json.loads(b64d(claims))
                assert h["alg"] == "RS256" and h["kid"] == "k1", h
                assert c["iss"] == EMAIL and c["aud"] == TOKEN_URI, c
                assert c["scope"] == "https://www.googleapis.com/auth/cloud-platform", c
                assert c["iat"] <= time.time() + 60 < c["exp"] + 60, c
            except Exception as e:
                return self.reply(400, {"error": "invalid_grant", "error_description": repr(e)})
            return self.issue("gcp")
        client_id, secret, tenant = DATA["azure_client"]
        if path == f"/{tenant}/oauth2/v2.0/token":
            if (f.get("grant_type") != "client_credentials" or f.get("client_id") != client_id
                    or f.get("client_secret") != secret
                    or f.get("scope") != "https://vault.azure.net/.default"):
                return self.reply(401, {"error": "invalid_client",
                                        "error_description": "AADSTS7000215: Invalid client secret provided."})
            return self.issue("azure")
        self.reply(404, {"error": "not_found"})

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        REQUESTS.append("GET " + url.path)
        if url.path == "/_requests":
            return self.reply(200, REQUESTS[:-1])
        if url.path.startswith("/v1/") and url.path.endswith(":access"):
            if not self.bearer("gcp"):
                return self.reply(401, {"error": {"code": 401, "status": "UNAUTHENTICATED",
                                                  "message": "Request had invalid authentication credentials."}})
            name = url.path[len("/v1/"):-len(":access")]
            secret = name.rsplit("/versions/", 1)[0]
            if secret not in DATA["gcp"]:
                return self.reply(404, {"error": {"code": 404, "status": "NOT_FOUND",
                                                  "message": f"Secret [{secret}] not found or has no versions."}})
            return self.reply(200, {"name": name, "payload": {
                "data": base64.b64encode(DATA["gcp"][secret].encode()).decode()}})
        if url.path.startswith("/kv/"):
            if not self.bearer("azure"):
                return self.reply(401, {"error": {"code": "Unauthorized",
                                                  "message": "AKV10000: Request is missing a Bearer or PoP token."}})
            if urllib.parse.parse_qs(url.query).get("api-version") != ["7.4"]:
                return self.reply(400, {"error": {"code": "BadParameter", "message": "api-version"}})
            _, _, vault, _, name = url.path.split("/", 4)
            value = DATA["azure"].get(f"{vault}/{name}")
            if value is None:
                return self.reply(404, {"error": {"code": "SecretNotFound", "message":
                                                  f"A secret with (name/id) {name} was not found in this key vault."}})
            return self.reply(200, {"value": value, "id": f"https://{vault}.vault.azure.net/secrets/{name}/1"})
        self.reply(404, {"error": "not_found"})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
