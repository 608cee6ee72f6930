"""A local authorization server and API on loopback (HTTPS under the test CA) for token minting.

``POST /token`` (RFC 6749 §4.4, §6; RFC 7523 §2.1/§2.2) counts the token requests it gets,
checks the client authentication against the real secret (or the JWT against the public key),
and issues tokens that expire after ``expires_in`` seconds; ``fail`` makes it answer an error
whose body holds ``leak`` (a canary that must never reach the sandbox). ``GET /api`` accepts a
bearer token it issued and still valid, else 401. ``/hmac/...`` verifies the example HMAC
signature (rules/README.md) with the real secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote

import jwt
from servers import TestCA


class AuthServer:
    def __init__(self, ca: TestCA, names: list[str], client_id: str, client_secret: str = "") -> None:
        self.client_id, self.client_secret = client_id, client_secret
        self.public_key: Any = None  # jwt_bearer / private_key_jwt: verify with it
        self.audience = ""
        self.refresh = ""  # the refresh token it accepts next (rotated on each use)
        self.hmac_secret = ""
        self.hmac_signs_body = True  # False: the scheme signs timestamp + method + path?query only
        self.expires_in = 3600
        self.fail: tuple[int, dict[str, str]] | None = None
        self.delay = 0.0
        self.token_requests = 0
        self.grants: list[str] = []
        self.issued: dict[str, float] = {}  # valid tokens -> expiry
        self.handed: list[str] = []  # every token and refresh token handed out
        self.paths: list[str] = []  # every request target received
        self.heads: dict[str, list[tuple[str, str]]] = {}  # each target's header fields, as received
        self.api_auth: list[str] = []  # Authorization each /api request carried
        self.lock = threading.Lock()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*names).configure_cert(ctx)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]

    def start(self) -> AuthServer:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- token endpoint

    def token(self, headers: Any, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.token_requests += 1
            self.grants.append(form.get("grant_type", ""))
        time.sleep(self.delay)
        if self.fail is not None:
            return self.fail
        if not self._client_ok(headers, form):
            return 401, {"error": "invalid_client"}
        grant = form.get("grant_type")
        out: dict[str, Any] = {}
        if grant == "refresh_token":
            if not self.refresh or not hmac.compare_digest(form.get("refresh_token", ""), self.refresh):
                return 400, {"error": "invalid_grant"}
            self.refresh = "rt-" + secrets.token_urlsafe(24)  # rotated: the old one is spent
            self.handed.append(self.refresh)
            out["refresh_token"] = self.refresh
        elif grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            if not self._jwt_ok(form.get("assertion", "")):
                return 400, {"error": "invalid_grant"}
        elif grant != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        token = "at-" + secrets.token_urlsafe(24)
        with self.lock:
            self.issued[token] = time.time() + self.expires_in
            self.handed.append(token)
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in, **out}

    def _client_ok(self, headers: Any, form: dict[str, str]) -> bool:
        auth = headers.get("Authorization", "")
        if auth.startswith("Basic "):
            cid, _, sec = base64.b64decode(auth[6:]).decode().partition(":")
            return unquote(cid) == self.client_id and hmac.compare_digest(unquote(sec), self.client_secret)
        if "client_secret" in form:
            return form.get("client_id") == self.client_id and hmac.compare_digest(
                form["client_secret"], self.client_secret
            )
        if "client_assertion" in form:
            return self._jwt_ok(form["client_assertion"])
        return self.public_key is not None and form.get("grant_type", "").endswith("jwt-bearer")

    def _jwt_ok(self, assertion: str) -> bool:
        try:
            claims = jwt.decode(assertion, self.public_key, algorithms=["RS256"], audience=self.audience)
        except jwt.PyJWTError:
            return False
        return claims.get("iss") == self.client_id

    # -- the API

    def api_ok(self, auth: str) -> bool:
        with self.lock:
            self.api_auth.append(auth)
            exp = self.issued.get(auth.removeprefix("Bearer "))
        return exp is not None and time.time() < exp

    def hmac_ok(self, method: str, target: str, headers: Any, body: bytes) -> bool:
        """The example scheme: hex HMAC-SHA256 over timestamp + method + path?query + body."""
        ts = headers.get("X-Timestamp", "")
        sig = headers.get("X-Signature", "")
        if not ts or not sig or abs(time.time() - int(ts)) > 300:
            return False
        msg = ts.encode() + method.encode() + target.encode() + (body if self.hmac_signs_body else b"")
        want = hmac.new(self.hmac_secret.encode(), msg, hashlib.sha256).hexdigest()
        return hmac.compare_digest(sig, want)


def _handler(server: AuthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _send(self, status: int, doc: object) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            server.paths.append(self.path)
            server.heads[self.path] = list(self.headers.items())
            body = self._body()
            if self.path == "/token":
                form = dict(parse_qsl(body.decode()))
                self._send(*server.token(self.headers, form))
            elif self.path.startswith("/hmac"):
                ok = server.hmac_ok("POST", self.path, self.headers, body)
                self._send(200 if ok else 401, {"ok": ok, "len": len(body)})
            else:
                self._send(404, {})

        def do_GET(self) -> None:
            server.paths.append(self.path)
            server.heads[self.path] = list(self.headers.items())
            if self.path.startswith("/hmac"):
                ok = server.hmac_ok("GET", self.path, self.headers, b"")
                self._send(200 if ok else 401, {"ok": ok})
                return
            auth = self.headers.get("Authorization", "")
            ok = server.api_ok(auth)
            self._send(200 if ok else 401, {"ok": ok, "seen": auth[:7]})

    return Handler
