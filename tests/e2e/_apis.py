"""Local stand-ins for the APIs of the client matrix (tests/e2e/test_client_matrix.py), one
threaded HTTPS/1.1 server (stdlib) under the real host names, each answering only its real secret:

- ``api.openai.com``    POST /v1/chat/completions, streamed (SSE chunks, then ``data: [DONE]``);
                        ``Authorization: Bearer <secret>``
- ``api.anthropic.com`` POST /v1/messages, streamed (Anthropic's SSE events); ``x-api-key``, or
                        ``Authorization: Bearer`` (what the SDK 2.x sends)
- ``api.github.com``    GET /user (what ``gh api user`` asks); ``Authorization: token|Bearer``
- ``npm.test``          an npm registry: GET /<name> (the packument), GET /<name>/-/<tarball>;
                        ``Authorization: Bearer <secret>`` (an ``.npmrc`` ``_authToken``)
- ``api.test``          GET anything: ``{"ok": true}``; ``Authorization: Bearer <secret>``

Anything else gets 401 (wrong or missing secret) or 404. ``seen`` records (host, method, path,
the credential header's value) per request; no response echoes a request header.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import io
import json
import socket
import ssl
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from servers import TestCA

NPM_PACKAGE = "surrogate-e2e-pkg"
NPM_VERSION = "1.0.0"
NPM_MAIN = 'module.exports = "installed via surrogate";\n'
HOSTS = ("api.openai.com", "api.anthropic.com", "api.github.com", "npm.test", "api.test")
STREAM_WORDS = ("Hello", " from", " the", " stub")


def npm_tarball() -> bytes:
    """``package/package.json`` and ``package/index.js`` as npm packs them (gzipped tar)."""
    files = {
        "package/package.json": json.dumps({"name": NPM_PACKAGE, "version": NPM_VERSION, "main": "index.js"}),
        "package/index.js": NPM_MAIN,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Apis:
    """The server on ``bind`` (an address of 127.0.0.0/8, port 443 by default: the SDKs and gh
    use their real URLs, unchanged); ``secrets`` maps each host to the value it accepts."""

    ca: TestCA
    secrets: dict[str, str]
    bind: tuple[str, int] = ("127.0.0.1", 443)
    seen: list[tuple[str, str, str, str]] = field(default_factory=list)
    tarball: bytes = field(default_factory=npm_tarball)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ca.ca.issue_cert(*HOSTS).configure_cert(ctx)
        ctx.set_alpn_protocols(["http/1.1"])
        self._server = _Server(self.bind, _Handler, ctx, self)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Apis:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()

    def record(self, host: str, method: str, path: str, credential: str) -> None:
        with self._lock:
            self.seen.append((host, method, path, credential))

    def requests(self, host: str) -> list[tuple[str, str, str]]:
        with self._lock:
            return [(m, p, c) for h, m, p, c in self.seen if h == host]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bind: tuple[str, int], handler: type, ctx: ssl.SSLContext, apis: Apis) -> None:
        self.ctx, self.apis = ctx, apis
        super().__init__(bind, handler)

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        request.settimeout(15)
        with contextlib.suppress(OSError), self.ctx.wrap_socket(request, server_side=True) as conn:
            self.RequestHandlerClass(conn, client_address, self)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _host(self) -> str:
        return (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()

    def _credential(self, host: str) -> str:
        if host == "api.anthropic.com" and "x-api-key" in self.headers:  # older SDKs; 2.x: Bearer
            return self.headers["x-api-key"]
        return self.headers.get("Authorization", "")

    def _authorized(self, host: str, given: str) -> bool:
        secret = self.server.apis.secrets.get(host)
        if secret is None:
            return False
        if host == "api.anthropic.com" and "x-api-key" in self.headers:
            return hmac.compare_digest(given.encode(), secret.encode())
        scheme, _, value = given.partition(" ")
        ok = ("bearer", "token") if host == "api.github.com" else ("bearer",)
        return scheme.lower() in ok and hmac.compare_digest(value.encode(), secret.encode())

    def _dispatch(self) -> None:
        host = self._host()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        given = self._credential(host)
        self.server.apis.record(host, self.command, self.path, given)
        if not self._authorized(host, given):
            return self._send(401, {"error": {"message": "bad credentials", "type": "auth"}})
        path = self.path.split("?", 1)[0]
        if host == "api.openai.com" and (self.command, path) == ("POST", "/v1/chat/completions"):
            return self._openai(json.loads(body))
        if host == "api.anthropic.com" and (self.command, path) == ("POST", "/v1/messages"):
            return self._anthropic(json.loads(body))
        if host == "api.github.com" and path == "/user":
            return self._send(200, {"login": "surrogate-octocat", "id": 1})
        if host == "npm.test":
            return self._npm(path)
        if host == "api.test":
            return self._send(200, {"ok": True, "path": self.path})
        return self._send(404, {"error": "not found"})

    do_GET = do_POST = _dispatch

    def _send(self, status: int, obj: object, ctype: str = "application/json") -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _events(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _openai(self, req: dict[str, object]) -> None:
        assert req.get("stream") is True, req
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": req["model"]}
        chunks = [
            {**base, "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]}
            for w in STREAM_WORDS
        ]
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self._events([b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"])

    def _anthropic(self, req: dict[str, object]) -> None:
        assert req.get("stream") is True, req
        usage = {"input_tokens": 1, "output_tokens": 1}
        msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": req["model"], "content": []}
        events: list[tuple[str, dict[str, object]]] = [
            ("message_start", {"message": {**msg, "stop_reason": None, "usage": usage}}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            *(
                ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": w}})
                for w in STREAM_WORDS
            ),
            ("content_block_stop", {"index": 0}),
            ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
            ("message_stop", {}),
        ]
        self._events(
            [
                f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
                for name, data in events
            ]
        )

    def _npm(self, path: str) -> None:
        apis = self.server.apis
        tgz = f"{NPM_PACKAGE}-{NPM_VERSION}.tgz"
        if path == f"/{NPM_PACKAGE}":
            integrity = "sha512-" + base64.b64encode(hashlib.sha512(apis.tarball).digest()).decode()
            dist = {
                "tarball": f"https://{self.headers['Host']}/{NPM_PACKAGE}/-/{tgz}",
                "shasum": hashlib.sha1(apis.tarball).hexdigest(),  # noqa: S324 - npm's own field
                "integrity": integrity,
            }
            manifest = {"name": NPM_PACKAGE, "version": NPM_VERSION, "main": "index.js", "dist": dist}
            doc = {
                "name": NPM_PACKAGE,
                "dist-tags": {"latest": NPM_VERSION},
                "versions": {NPM_VERSION: manifest},
            }
            return self._send(200, doc)
        if path == f"/{NPM_PACKAGE}/-/{tgz}":
            return self._send(200, apis.tarball, "application/octet-stream")
        return self._send(404, {"error": "not found"})
