"""A real HTTPS/1.1 upstream for end-to-end tests: stdlib + trustme only.

Endpoints: GET /sse, GET /bytes/<n>, POST|PUT /upload, /git/... (git smart HTTP through the real
git-http-backend CGI), /reflect* (a hostile echo of the Authorization header, for the scrubbing
tests), /echo (a hostile echo of every header, the query and the body, raw and escaped, in any
content coding or as SSE; also decompression bombs), /upgrade-raw (101 to a non-WebSocket
protocol, then the Authorization raw; any path ending so), and a JSON catch-all. No other
response echoes a request header value. ``Upstream.sessions`` holds the SNI of every TLS
session accepted, and each ``Recorded.session`` the index of the session its request came over.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import gzip
import hashlib
import hmac
import json
import os
import pathlib
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import IO
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

import brotli  # type: ignore[import-untyped]
import trustme

from proxy.core.decode import zstd

CHUNK = 64 * 1024
GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
README_TEXT = "hello from upstream\n"
_PATTERN = bytes(range(256)) * (CHUNK // 256)  # one reusable block: /bytes/<n> never holds n bytes


class TestCA:
    """A throwaway CA whose PEM clients (and the proxy under test) can be told to trust."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, tmpdir: pathlib.Path) -> None:
        self.ca = trustme.CA()
        self.ca_pem = pathlib.Path(tmpdir) / "upstream-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))


@dataclass
class Recorded:
    method: str
    path: str  # raw request target, including query
    headers: list[tuple[str, str]]  # in order, as received
    body_len: int
    session: int = -1  # index into Upstream.sessions of the TLS session it came over
    digest: str = ""  # SHA-256 (hex) of the body, for the catch-all endpoints (/upload, JSON)


def echo_lines(headers: list[tuple[str, str]], target: str, body: bytes) -> list[bytes]:
    """/echo's lines: the target, the body, then each header value, the target and the body, raw
    and escaped: percent (all, and form-style), JSON (default and all ``\\u``), base64 alone
    (standard, URL-safe unpadded) and inside a longer run at each of the three alignments."""
    lines = [target.encode(), body]
    for v in [v for _, v in headers] + [target, body.decode("utf-8", "replace")]:
        raw = v.encode()
        lines += [
            raw,
            quote(v, safe="").encode(),
            quote_plus(v).encode(),
            json.dumps(v).encode(),
            "".join(f"\\u{ord(c):04x}" for c in v if ord(c) < 0x10000).encode(),
            base64.b64encode(raw),
            base64.urlsafe_b64encode(raw).rstrip(b"="),
            *(base64.b64encode(b"x" * k + raw + b"yz") for k in (1, 2, 3)),
        ]
    return lines


def compress(enc: str, data: bytes) -> bytes:
    if enc == "gzip":
        return gzip.compress(data)
    if enc == "deflate":
        return zlib.compress(data)
    if enc == "br":
        return brotli.compress(data)
    if enc == "zstd":
        return zstd.compress(data)
    return data  # identity, or a coding the proxy cannot decode (sent as is, mislabelled)


@functools.cache
def bomb(enc: str) -> bytes:
    """200 MiB of zeros in ``enc`` (a few hundred KiB at most), built once."""
    return compress(enc, b"\0" * (200 << 20))


def _isolated_git_env() -> dict[str, str]:
    # The developer's own git config (signing, credential helpers, hooks) must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return env


def _make_bare_repo(root: pathlib.Path) -> None:
    work = root / "work"

    def git(*args: str) -> None:
        subprocess.run(["git", *args], env=_isolated_git_env(), check=True, capture_output=True)

    git("init", "-q", "-b", "main", str(work))
    (work / "README").write_text(README_TEXT)
    git("-C", str(work), "add", "README")
    git(
        "-C",
        str(work),
        "-c",
        "user.name=upstream",
        "-c",
        "user.email=upstream@test",
        "commit",
        "-q",
        "-m",
        "initial",
    )
    git("clone", "-q", "--bare", str(work), str(root / "repo.git"))
    shutil.rmtree(work)


# The fake token endpoint and a second URL of it, as providers keep one per API version
# (Microsoft's /oauth2/token beside /oauth2/v2.0/token): both grant the same refresh tokens.
TOKEN_PATHS = ("/oauth/token", "/oauth/v1/token")


def _routed(path: str) -> str:
    """``path`` as a lenient web framework routes it (the token endpoint is matched so): percent-
    decoded, ``;params`` dropped, empty segments (``//``, a trailing slash) ignored."""
    return "/" + "/".join(p.split(";", 1)[0] for p in unquote(path).split("/") if p.split(";", 1)[0])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection must not pin a thread forever
    disable_nagle_algorithm = True  # SSE events are tiny; do not let Nagle hold them back
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    @property
    def upstream(self) -> Upstream:
        return self.server.upstream

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        if path == "/git" or path.startswith("/git/"):
            return self._git(path.removeprefix("/git"))
        if self.command == "GET" and path == "/sse":
            return self._sse()
        if self.command == "GET" and (m := re.fullmatch(r"/bytes/(\d+)", path)):
            return self._bytes(int(m[1]))
        if path == "/echo":
            return self._echo()
        if path.endswith("/upgrade-raw"):
            return self._upgrade_raw()
        if path.endswith("/upgrade-asked") and self.headers.get("Upgrade"):
            return self._upgrade_raw(self.headers["Upgrade"])  # as an h2c server does; else a 200
        if self.command == "POST" and _routed(path) in TOKEN_PATHS:
            return self._token()
        digest, received = hashlib.sha256(), 0
        for chunk in self._body():
            digest.update(chunk)
            received += len(chunk)
        self._record(received, digest.hexdigest())
        if path.startswith("/reflect"):
            return self._reflect(path)
        if self.command in ("POST", "PUT") and path == "/upload":
            return self._json({"received": received})
        self._json({"ok": True, "method": self.command, "path": self.path})

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _dispatch

    # -- request/response plumbing ------------------------------------------------------------

    def _record(self, body_len: int, digest: str = "") -> None:
        session = getattr(self.connection, "surrogate_session", -1)
        rec = Recorded(self.command, self.path, list(self.headers.items()), body_len, session, digest)
        self.upstream._record(rec)

    def _body(self) -> Iterator[bytes]:
        """Yield the request body as it arrives, de-chunking if needed; never buffers it whole."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while size := self._chunk_size():
                yield from self._read_exact(size)
                self.rfile.readline(1024)  # CRLF that ends the chunk data
            while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
        else:
            yield from self._read_exact(int(self.headers.get("Content-Length") or 0))

    def _chunk_size(self) -> int:
        line = self.rfile.readline(1024).split(b";")[0].strip()
        try:
            return int(line, 16)
        except ValueError:  # a body cut short (the proxy aborted it) ends as a closed connection
            raise ConnectionError("client closed mid-body") from None

    def _read_exact(self, n: int) -> Iterator[bytes]:
        while n > 0:
            data = self.rfile.read(min(n, CHUNK))
            if not data:
                raise ConnectionError("client closed mid-body")
            n -= len(data)
            yield data

    def _json(self, obj: object, status: int = 200, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(extra or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        # wfile is unbuffered (wbufsize=0), so each chunk is one sendall() onto the socket.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # -- endpoints ---------------------------------------------------------------------------

    def _upgrade_raw(self, protocol: str = "raw-echo") -> None:
        """A hostile upstream: 101 to a protocol that is not WebSocket, then the Authorization it
        received as raw bytes (a proxy relaying the upgraded bytes would leak it unscrubbed)."""
        self._record(0)
        self.send_response(101)
        self.send_header("Upgrade", protocol)
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        self.wfile.write(b"raw: " + (self.headers.get("Authorization") or "").encode() + b"\n")
        self.close_connection = True

    def _reflect(self, path: str) -> None:
        """A hostile upstream: hands the Authorization it received back (the scrubbing tests).
        /reflect in a header and the body, /reflect-split in two reads 200 ms apart (cut in the
        middle of the value), /reflect-gzip gzip-encoded whatever the request accepted. With
        ``?binary=1`` the body is sent as application/octet-stream (text/plain otherwise)."""
        auth = (self.headers.get("Authorization") or "").encode()
        ctype = "application/octet-stream" if "binary=1" in urlsplit(self.path).query else "text/plain"
        if path == "/reflect-split":
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(auth) // 2
            self._chunk(b"you sent: " + auth[:half])
            threading.Event().wait(0.2)
            self._chunk(auth[half:] + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        body = b"you sent: " + auth + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("X-Echo", auth.decode("latin-1"))
        if path == "/reflect-gzip":
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _echo(self) -> None:
        """GET|POST /echo?enc=identity|gzip|deflate|br|zstd|<other>&sse=1&bomb=1: every request
        header value, the raw query and the body, each raw and in the escaped forms scrubbing must
        catch (percent, JSON \\u, base64 alone and inside a longer run at every alignment). With
        ``sse=1`` each line is one event, sent in two reads 5 ms apart (gzip with a sync flush
        per read); with ``bomb=1`` the body is 200 MiB of zeros, compressed."""
        body = b"".join(self._body())
        self._record(len(body))
        query = dict(parse_qsl(urlsplit(self.path).query))
        enc = query.get("enc", "identity")
        lines = [] if query.get("bomb") else echo_lines(list(self.headers.items()), self.path, body)
        data = bomb(enc) if query.get("bomb") else b"\n".join(lines) + b"\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if query.get("sse") else "text/plain")
        self.send_header("X-Echo", self.headers.get("Authorization") or "-")
        if enc != "identity":
            self.send_header("Content-Encoding", enc)
        if not query.get("sse"):
            if not query.get("bomb"):
                data = compress(enc, data)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        z = zlib.compressobj(wbits=31) if enc == "gzip" else None
        for line in lines:
            event = b"data: " + line + b"\n\n"
            for part in (event[: len(event) // 2], event[len(event) // 2 :]):
                self._chunk(z.compress(part) + z.flush(zlib.Z_SYNC_FLUSH) if z else part)
                threading.Event().wait(0.005)
        if z:
            self._chunk(z.flush())
        self.wfile.write(b"0\r\n\r\n")

    def _token(self) -> None:
        """A fake OAuth 2.0 token endpoint (RFC 6749 §6): a refresh_token grant (form body) with a
        refresh token it issued (or ``upstream.oauth_refresh``, the first) gets new access,
        refresh and id tokens (recorded in ``upstream.oauth_issued``); anything else 400."""
        body = b"".join(self._body())
        self._record(len(body))
        form = dict(parse_qsl(body.decode("utf-8", "replace")))
        up = self.upstream
        self.upstream.oauth_seen.append(form.get("refresh_token", ""))
        known = {up.oauth_refresh, *(t["refresh_token"] for t in up.oauth_issued)}
        if form.get("grant_type") != "refresh_token" or form.get("refresh_token") not in known:
            return self._json({"error": "invalid_grant"}, status=400)
        issued = {
            k: f"CANARY{k.replace('_', '')}{os.urandom(12).hex()}"
            for k in ("access_token", "refresh_token", "id_token")
        }
        up.oauth_issued.append(issued)
        if up.oauth_raw is not None:  # a hostile endpoint's answer, head and body as given
            status, headers, data = up.oauth_raw(issued)
            self.send_response(status)
            for name, value in [*headers, ("Content-Length", str(len(data)))]:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            return None
        if up.oauth_reply is not None:  # a test's own answer shape: (status, JSON document)
            status, doc = up.oauth_reply(issued, form["refresh_token"])
            if not up.oauth_gzip:
                return self._json(doc, status=status)
            body = gzip.compress(json.dumps(doc).encode())
            if up.oauth_gzip == "transfer":  # a transfer coding under chunked (RFC 9112 §7)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "gzip, chunked")
                self.end_headers()
                self._chunk(body)
                self._chunk(b"")
                return None
            self.send_response(status)
            for name, value in (("Content-Type", "application/json"), ("Content-Encoding", "gzip")):
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        self._json({**issued, "token_type": "Bearer", "expires_in": 3600})

    def _sse(self) -> None:
        self._record(0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # Chunked rather than close-delimited so the connection stays reusable, like real APIs.
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(b"data: one\n\n")
        self.upstream.sse_release.wait(10)
        self._chunk(b"data: two\n\n")
        self._chunk(b"")

    def _bytes(self, n: int) -> None:
        self._record(0)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        while n > 0:
            block = _PATTERN[: min(n, CHUNK)]
            self.wfile.write(block)
            n -= len(block)

    def _git(self, path_info: str) -> None:
        # Spool the body first: the CGI gets a real file as stdin (no pipe deadlock while we
        # read its stdout) and an exact CONTENT_LENGTH even when the client sent chunked.
        with tempfile.TemporaryFile() as body:
            size = 0
            for data in self._body():
                body.write(data)
                size += len(data)
            body.seek(0)
            self._record(size)
            user = self._git_user()
            if user is None:
                self._json(
                    {"error": "authentication required"}, 401, {"WWW-Authenticate": 'Basic realm="git"'}
                )
                return
            env = _isolated_git_env() | {
                "GIT_PROJECT_ROOT": str(self.upstream._git_root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "GATEWAY_INTERFACE": "CGI/1.1",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": unquote(path_info),
                "QUERY_STRING": urlsplit(self.path).query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(size),
                "REMOTE_ADDR": self.client_address[0],
                "REMOTE_USER": user,
            }
            if enc := self.headers.get("Content-Encoding"):
                env["HTTP_CONTENT_ENCODING"] = enc  # http-backend inflates gzip itself
            if proto := self.headers.get("Git-Protocol"):
                env["GIT_PROTOCOL"] = proto
            proc = subprocess.Popen(
                [GIT_HTTP_BACKEND], stdin=body, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
            )
            with proc, contextlib.ExitStack() as cleanup:
                cleanup.callback(proc.kill)  # stops it if the client went away mid-relay
                self._relay_cgi(proc.stdout)  # type: ignore[arg-type]

    def _git_user(self) -> str | None:
        """The Basic-auth user if the request may proceed (any user; password must match)."""
        password = self.upstream.git_password
        if password is None:
            return ""
        scheme, _, cred = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, given = base64.b64decode(cred, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user if hmac.compare_digest(given.encode(), password.encode()) else None

    def _relay_cgi(self, out: IO[bytes]) -> None:
        status, headers = "200 OK", []
        while (line := out.readline()).strip():
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "status":
                status = value.strip()
            else:
                headers.append((name.strip(), value.strip()))
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason or None)
        chunked = not any(n.lower() == "content-length" for n, _ in headers)
        for name, value in headers + ([("Transfer-Encoding", "chunked")] if chunked else []):
            self.send_header(name, value)
        self.end_headers()
        while data := out.read1(CHUNK):  # type: ignore[attr-defined]
            self._chunk(data) if chunked else self.wfile.write(data)
        if chunked:
            self._chunk(b"")


class _Server(socketserver.TCPServer):
    allow_reuse_address = True

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        if ":" in upstream.bind[0]:  # an IPv6 address (the fence tests' upstream namespace)
            self.address_family = socket.AF_INET6
        super().__init__(upstream.bind, _Handler)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = super().get_request()
        self.upstream._accepted(sock)  # counted before TLS, so failed handshakes count too
        return sock, addr

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        t = threading.Thread(
            target=self.upstream._serve_connection,
            args=(self, request, client_address),
            name=f"upstream-conn-{client_address}",
            daemon=True,
        )
        self.upstream._track_thread(t)
        t.start()


class Upstream:
    """Threaded HTTPS/1.1 server on 127.0.0.1 (ephemeral port); plain HTTP/1.1 with ``tls=False``.

    Its certificate covers `hostnames` and is signed by the TestCA.
    """

    def __init__(
        self,
        ca: TestCA,
        hostnames: list[str],
        git_password: str | None = None,
        tmpdir: pathlib.Path | None = None,
        bind: tuple[str, int] = ("127.0.0.1", 0),
        tls: bool = True,
    ) -> None:
        self.bind = bind  # a test network namespace's address, for transparent-mode tests
        self.tls = tls  # False: plain HTTP/1.1 (the cleartext tests); sessions stay empty
        self.git_password = git_password
        self.requests: list[Recorded] = []
        self.connections = 0
        self.sessions: list[str | None] = []  # per completed TLS handshake: the SNI it carried
        self.resumed: list[bool] = []  # per completed TLS handshake: whether it resumed a session
        self.sse_release = threading.Event()
        self.oauth_refresh = ""  # /oauth/token: the first refresh token it accepts
        self.oauth_seen: list[str] = []  # refresh tokens received
        self.oauth_issued: list[dict[str, str]] = []  # tokens handed out
        # (issued tokens, refresh token presented) -> (status, JSON answer); None: the RFC 6749 one
        self.oauth_reply: Callable[[dict[str, str], str], tuple[int, object]] | None = None
        self.oauth_gzip: bool | str = False  # oauth_reply's answer gzip-encoded ("transfer": as TE)
        # issued tokens -> (status, [(header, value)], body): any answer at all, as sent
        self.oauth_raw: Callable[[dict[str, str]], tuple[int, list[tuple[str, str]], bytes]] | None = None
        self.port = 0
        self._tmpdir = tmpdir
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*hostnames).configure_cert(self._ctx)
        self._ctx.sni_callback = self._sni
        self._ctx.set_alpn_protocols(["http/1.1"])  # clients offering h2 must fall back
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._server: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self._git_root = pathlib.Path()

    def start(self) -> Upstream:
        self._git_root = pathlib.Path(tempfile.mkdtemp(prefix="upstream-git-", dir=self._tmpdir))
        _make_bare_repo(self._git_root)
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._serve_thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=f"upstream-{self.port}", daemon=True
        )
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # returns once the accept loop has exited
        server.server_close()
        assert self._serve_thread is not None
        self._serve_thread.join()
        self.sse_release.set()  # a parked /sse handler would otherwise hold stop() for 10 s
        with self._lock:
            live, threads = list(self._live), list(self._threads)
        for sock in live:
            # socket.socket.shutdown, not SSLSocket.shutdown: the latter drops the SSL object
            # under a handler thread that may be mid-read. This just wakes that read with EOF.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        for t in threads:
            t.join(10)
        if stuck := [t.name for t in threads if t.is_alive()]:
            raise RuntimeError(f"upstream threads did not stop: {stuck}")
        if self._tmpdir is None:
            shutil.rmtree(self._git_root, ignore_errors=True)

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def header_values(self, name: str) -> list[str]:
        with self._lock:
            recorded = list(self.requests)
        return [v for r in recorded for k, v in r.headers if k.lower() == name.lower()]

    # -- called from server threads -----------------------------------------------------------

    def _record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def _accepted(self, sock: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self._live.add(sock)

    def _sni(self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        sock.surrogate_sni = name  # type: ignore[union-attr]  # read back in _serve_connection

    def _track_thread(self, t: threading.Thread) -> None:
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve_connection(self, server: _Server, raw: socket.socket, addr: object) -> None:
        conn: socket.socket = raw
        try:
            raw.settimeout(10)  # a client that never finishes the handshake must not pin us
            # The handshake happens here, in the per-connection thread; wrap_socket detaches
            # `raw`, so from now on only `conn` owns the file descriptor.
            if self.tls:
                conn = self._ctx.wrap_socket(raw, server_side=True)
                with self._lock:
                    self._live.discard(raw)
                    self._live.add(conn)
                    conn.surrogate_session = len(self.sessions)  # type: ignore[attr-defined]
                    self.sessions.append(getattr(conn, "surrogate_sni", None))
                    self.resumed.append(conn.session_reused)  # type: ignore[attr-defined]
            _Handler(conn, addr, server)
        except OSError:
            pass  # handshake failures, resets and broken pipes are the client's business
        finally:
            with self._lock:
                self._live.discard(raw)
                self._live.discard(conn)
            conn.close()
            raw.close()
