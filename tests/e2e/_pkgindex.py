"""A PEP 503 simple package index over HTTPS behind HTTP Basic auth, for test_pip.py (stdlib only).

``build_wheel`` assembles a one-module pure-Python wheel by hand (METADATA, WHEEL, RECORD with
hashes), so no build backend or network is needed. ``PackageIndex`` serves it:

- ``GET /simple/``              the project list
- ``GET /simple/<name>/``       the project page, linking the wheel with its ``#sha256=`` hash
- ``GET /packages/<wheel>``     the wheel

Every request needs ``Authorization: Basic`` with the configured password (any user), else 401
with ``WWW-Authenticate``. Each request's Authorization value is recorded. Responses never echo a
request header.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import html
import io
import re
import socket
import socketserver
import ssl
import threading
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from urllib.parse import urlsplit

from servers import TestCA


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class Wheel:
    project: str  # e.g. "surrogate-e2e-demo"
    module: str  # the one top-level module it installs
    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def build_wheel(project: str, version: str, module: str, source: str) -> Wheel:
    dist = re.sub(r"[-_.]+", "_", project)
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{module}.py": source.encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
            "Summary: surrogate e2e test package\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: surrogate-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return Wheel(project, module, f"{dist}-{version}-py3-none-any.whl", buf.getvalue())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        index = self.server.index
        index._record(self.headers.get("Authorization", ""), self.path)
        if not index._authorized(self.headers.get("Authorization", "")):
            self._send(
                401, b"authentication required\n", "text/plain", {"WWW-Authenticate": 'Basic realm="pkgs"'}
            )
            return
        path = urlsplit(self.path).path
        wheels = {_normalize(w.project): w for w in index.wheels}
        if path == "/simple/":
            links = "".join(f'<a href="/simple/{n}/">{html.escape(n)}</a>\n' for n in wheels)
            self._send(200, self._page("Simple index", links), "text/html")
        elif (m := re.fullmatch(r"/simple/([^/]+)/", path)) and (w := wheels.get(_normalize(m[1]))):
            link = f'<a href="/packages/{w.filename}#sha256={w.sha256}">{html.escape(w.filename)}</a>\n'
            self._send(200, self._page(f"Links for {w.project}", link), "text/html")
        elif (m := re.fullmatch(r"/packages/([^/]+)", path)) and (
            w := next((w for w in index.wheels if w.filename == m[1]), None)
        ):
            self._send(200, w.data, "application/octet-stream")
        else:
            self._send(404, b"not found\n", "text/plain")

    do_HEAD = do_GET  # uv asks HEAD of a wheel first (range requests for its metadata)

    @staticmethod
    def _page(title: str, body: str) -> bytes:
        return (
            f"<!DOCTYPE html>\n<html><head><title>{html.escape(title)}</title></head>"
            f"<body><h1>{html.escape(title)}</h1>\n{body}</body></html>\n"
        ).encode()

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": ctype, **(extra or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = False  # so server_close() joins every handler thread
    allow_reuse_address = True

    def __init__(self, index: PackageIndex) -> None:
        self.index = index
        super().__init__(index.bind, _Handler)

    def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        # The TLS handshake runs here, in the connection's own thread, not in the accept loop.
        request.settimeout(10)
        self.index._track(request, add=True)
        try:
            with self.index._ctx.wrap_socket(request, server_side=True) as conn:
                self.index._track(conn, add=True)
                try:
                    _Handler(conn, client_address, self)
                finally:
                    self.index._track(conn, add=False)
        except OSError:
            pass  # resets and failed handshakes are the client's business
        finally:
            self.index._track(request, add=False)


class PackageIndex:
    """Threaded HTTPS index on 127.0.0.1 (ephemeral port), certificate for `hostname` from the TestCA."""

    def __init__(
        self,
        ca: TestCA,
        hostname: str,
        password: str,
        wheels: list[Wheel],
        bind: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self.bind = bind  # a test namespace's address for the transparent-mode test
        self.password = password
        self.wheels = wheels
        self.seen: list[tuple[str, str]] = []  # (Authorization value, request target), in order
        self.port = 0
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(hostname).configure_cert(self._ctx)
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> PackageIndex:
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        assert self._thread is not None
        self._thread.join()
        with self._lock:
            live = list(self._live)
        for sock in live:  # wakes handler threads parked on a keep-alive read
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        server.server_close()  # joins the handler threads (ThreadingMixIn.block_on_close)

    def __enter__(self) -> PackageIndex:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _record(self, authorization: str, target: str) -> None:
        with self._lock:
            self.seen.append((authorization, target))

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            (self._live.add if add else self._live.discard)(sock)

    def _authorized(self, header: str) -> bool:
        scheme, _, cred = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            _, _, given = base64.b64decode(cred, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return hmac.compare_digest(given.encode(), self.password.encode())
