"""Every path from an upstream back to the sandbox, end to end (issue 13 class 2, issue 20 items 1
and 4): bodiless responses keep their framing on a kept-alive connection, a 103 is not taken for
the final response, HTTP/1 trailers (either direction) are dropped without a hang, HTTP/2
trailers, the reason phrase, header names, a 101 head and WebSocket messages (text and binary)
are scrubbed, and a non-ASCII secret in its per-byte JSON spelling too. The upstreams write
exact bytes (tests/rawserver.py), speak HTTP/2 (hypercorn) or WebSocket (websockets); at the end
of the module every byte the clients received is scanned for the canaries in every form
tests/canary.py knows."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import re
import secrets
import socket
import ssl
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import brotli
import canary
import h11
import pytest
import wsproto
from harness import ProxyProcess
from hypercorn_server import HypercornServer
from rawserver import RawUpstream
from servers import TestCA, echo_lines
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.sync.client import connect
from world import Stage, WsServer, control, credential, egress, rules
from wsproto import events as wse

pytestmark = pytest.mark.e2e

PH = "surr_RespPathsPlaceholder0001"
PH_UNI = "surr_RespPathsUnicodePlace0002"


class H2Trailers(HypercornServer):
    """HTTP/2: a body, then trailers holding ``secret`` in a value and a name."""

    def __init__(self, ca: TestCA, tmp: Path, secret: str) -> None:
        cert = ca.ca.issue_cert("api.test")
        cert_pem, key_pem = tmp / "h2t-cert.pem", tmp / "h2t-key.pem"
        cert.cert_chain_pems[0].write_to_path(str(cert_pem))
        cert.private_key_pem.write_to_path(str(key_pem))
        super().__init__(cert_pem, key_pem, ["h2"], "h2trailers")
        self.secret = secret

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        s = self.secret.encode()
        head = [(b"content-type", b"text/plain"), (b"trailer", b"x-trailer")]
        await send({"type": "http.response.start", "status": 200, "headers": head, "trailers": True})
        await send({"type": "http.response.body", "body": b"h2 body\n"})
        trailers = [(b"x-trailer", b"Bearer " + s), (b"x-" + s.lower(), b"1")]
        await send({"type": "http.response.trailers", "headers": trailers})


class WsReflect(WsServer):
    """A TLS WebSocket upstream that hands back the Authorization it got: in its 101 head (a
    header value, a header name), then on each client message as one text and one binary
    message holding every escaped form tests/servers.py ``echo_lines`` makes."""

    def __init__(self, ca: TestCA) -> None:
        super().__init__(ca, ["api.test"], process_response=self._head)
        self.auth: list[str] = []

    @staticmethod
    def _head(conn: ServerConnection, request: Request, response: Response) -> Response:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ")
        headers = Headers(response.headers)
        headers["X-Echo"] = auth
        headers[f"X-{token}"] = "1"
        return Response(response.status_code, response.reason_phrase, headers, response.body)

    async def handler(self, ws: ServerConnection) -> None:
        auth = ws.request.headers.get("Authorization", "") if ws.request else ""
        self.auth.append(auth)
        lines = b"\n".join(echo_lines([("authorization", auth)], "/ws", b""))
        async for message in ws:
            if message == "control":  # the frames with no hook: pong, ping, close
                token = auth.removeprefix("Bearer ")
                await ws.pong(token.encode())
                await ws.ping(f"ping {token}".encode())
                await ws.close(4000, f"bye {token}")
                return
            if message == "auths":  # what the last two connections sent (a broadcast)
                await ws.send("\n".join(self.auth[-2:]))
                continue
            if message == "fragments":  # one message in many frames, the secret split across them
                token = auth.removeprefix("Bearer ")
                await ws.send(["text:" + token[:5], token[5:17], token[17:] + ":end"])
                await ws.send([b"bin:" + token[:9].encode(), token[9:].encode(), b":end"])
                await ws.send([base64.b64encode(f"xy{token}z".encode()).decode()[:11],
                               base64.b64encode(f"xy{token}z".encode()).decode()[11:]])  # fmt: skip
                continue
            await ws.send(lines.decode("utf-8", "replace"))
            await ws.send(b"\x00\x01binary:" + lines)


@dataclass
class World:
    proxy: ProxyProcess
    raw: RawUpstream
    h2: H2Trailers
    ws: WsReflect
    secret: str  # ASCII canary
    uni: str  # non-ASCII canary
    received: list[bytes] = field(default_factory=list)

    def curl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "15", "-x", self.proxy.url("c", "tok"),
             "--cacert", str(self.proxy.ca_pem), *args],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        self.received.append(done.stdout + done.stderr)
        return done

    def twice(self, proto: str, first: list[str], url: str, then: str) -> subprocess.CompletedProcess[bytes]:
        """One curl, two requests on one connection (``--next``): ``url`` with ``first`` options,
        then a GET of ``then``; each prints its head, body and ``code=... connects=...``."""
        out = ["-D", "-", "-w", "\ncode=%{http_code} connects=%{num_connects}\n"]
        again = ["-x", self.proxy.url("c", "tok"), "--cacert", str(self.proxy.ca_pem), "-sS"]
        return self.curl(proto, *first, *out, url, "--next", proto, *again, *out, then)

    def raw_url(self, path: str) -> str:
        return f"https://api.test:{self.raw.port}{path}"

    def tunnel(self, data: bytes, timeout: float = 10) -> bytes:
        """Raw bytes through the claim's CONNECT tunnel to the raw upstream; all read back."""
        auth = base64.b64encode(b"c:tok").decode()
        host = f"api.test:{self.raw.port}"
        with socket.create_connection(("127.0.0.1", self.proxy.port), timeout=timeout) as sock:
            head = f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
            sock.sendall(head.encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
            with ctx.wrap_socket(sock, server_hostname="api.test") as tls:
                tls.sendall(data)
                out = b""
                try:
                    while chunk := tls.recv(65536):
                        out += chunk
                except (ConnectionError, ssl.SSLError, TimeoutError):
                    pass
        self.received.append(out)
        return out


def _bodies(s: str) -> dict[str, bytes]:
    """Raw upstream answers built from secret ``s`` (the upstream reflects it)."""
    b = s.encode()
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n"
    return {
        "/204": b"HTTP/1.1 204 No Content\r\nX-Echo: " + b + b"\r\n\r\n",
        "/304": b'HTTP/1.1 304 Not Modified\r\nETag: "' + b + b'"\r\n\r\n',
        "/ok": ok,
        # an upstream that frames a bodiless response as chunked anyway (RFC 9112 §6.1 forbids it)
        "/204te": b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
        "/304te": b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        "/early": b"HTTP/1.1 103 Early Hints\r\nLink: </" + b + b">; rel=preload\r\nX-" + b + b": 1\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nfinal\n",
        "/early-many": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 " + b + b"\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nX-Echo: " + b + b"\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nfinal\n",
        "/trailers": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n"
        b"Trailer: X-Trailer\r\n\r\n6\r\nhello\n\r\n0\r\nX-Trailer: " + b + b"\r\n\r\n",
        "/reason": b"HTTP/1.1 200 "
        + b
        + b"\r\nX-"
        + b
        + b": v\r\n"
        + b
        + b": w\r\nContent-Length: 3\r\n\r\nok\n",
    }


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _hostile(s: str) -> dict[str, bytes]:
    """Raw answers of a hostile upstream (review r4): ``s`` in odd corners of HTTP/1 framing."""
    b = s.encode()
    text = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    gz = gzip.compress(b"gz:" + b + b"\n")
    multipart = (
        b"--XX\r\nContent-Type: text/plain\r\n\r\n" + b + b"\r\n--XX\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n\r\n"
        + base64.b64encode(b)
        + b"\r\n--XX--\r\n"
    )
    return {
        # a transfer coding other than chunked (RFC 9112 §7): mitmproxy reads the chunks and keeps
        # the gzip coding on the body; it is not a Content-Encoding
        "/te-gzip": text + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + _chunk(gz) + b"0\r\n\r\n",
        "/te-deflate": text
        + b"Transfer-Encoding: deflate, chunked\r\n\r\n"
        + _chunk(zlib.compress(b"df:" + b + b"\n"))
        + b"0\r\n\r\n",
        "/fold": text + b"X-Fold: start\r\n " + b + b"\r\nContent-Length: 3\r\n\r\nok\n",
        "/chunk-ext": text + b"Transfer-Encoding: chunked\r\n\r\n6;ext=" + b + b"\r\nhello\n\r\n0\r\n\r\n",
        "/long-header": text + b"X-Long: " + b"a" * 30000 + b + b"\r\nContent-Length: 3\r\n\r\nok\n",
        "/redirect": b"HTTP/1.1 302 Found\r\nLocation: https://api.test/cb?code=" + b + b"\r\n"
        b"Set-Cookie: a=" + b + b"; Path=/\r\nSet-Cookie: " + b + b"=1\r\nContent-Length: 0\r\n\r\n",
        "/early-flood": (b"HTTP/1.1 103 Early Hints\r\nLink: </" + b + b">; rel=preload\r\n\r\n") * 200
        + text
        + b"Content-Length: 6\r\n\r\nfinal\n",
        "/ce-nested": text + b"Content-Encoding: gzip, gzip\r\nContent-Length: %d\r\n\r\n%s"
        % (len(gzip.compress(gz)), gzip.compress(gz)),
        "/ce-twice": text + b"Content-Encoding: gzip\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(gzip.compress(gz)), gzip.compress(gz)),
        "/ce-br": text + b"Content-Encoding: br\r\nContent-Length: %d\r\n\r\n%s"
        % (len(brotli.compress(b"br:" + b)), brotli.compress(b"br:" + b)),
        "/multipart": b"HTTP/1.1 200 OK\r\nContent-Type: multipart/mixed; boundary=XX\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(multipart), multipart),
        # bytes after a bodiless answer: the upstream connection is out of step (a body after a 304)
        "/304-body": b"HTTP/1.1 304 Not Modified\r\nContent-Length: 45\r\n\r\nleft " + b + b" over\n",
        "/204-body": b"HTTP/1.1 204 No Content\r\n\r\nleft " + b + b" over\n",
        "/head-body": b"HTTP/1.1 200 OK\r\nContent-Length: 45\r\n\r\nleft " + b + b" over\n",
        "/head-te": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Echo: " + b + b"\r\n\r\n",
    }


def _dribble(s: str) -> list[bytes]:
    """An SSE stream that writes the secret one byte per chunk (each its own write), raw, then in
    JSON escapes and base64 split the same way, each event ending in a blank line."""
    b = s.encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = [b"data: " + b + b"\n\n", b'data: {"t": "' + json.dumps(s)[1:-1].encode() + b'"}\n\n',
              b"data: " + base64.b64encode(b"xy" + b + b"z") + b"\n\n"]  # fmt: skip
    pieces = [head]
    for event in events:
        pieces += [_chunk(event[i : i + 1]) for i in range(len(event))]
    return [*pieces, _chunk(b"data: tail\n\n"), b"0\r\n\r\n"]


def _decoded_bodies(data: bytes) -> bytes:
    """Every response body in ``data`` (client-received HTTP/1 bytes after the tunnel's TLS),
    de-chunked by h11 and then undone of any gzip/deflate/br coding, whatever the headers say."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "api.test")]))
    conn.receive_data(data)
    body = b""
    try:
        while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.Data):
                body += bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                break
    except h11.RemoteProtocolError:
        pass
    out = [body]
    for undo in (lambda d: zlib.decompressobj(47).decompress(d), zlib.decompress, brotli.decompress):
        with contextlib.suppress(Exception):  # not in that coding
            out.append(undo(body))
    return b"\n".join(out)


def _reflected(value: str) -> list[bytes]:
    """``value`` in every spelling the scrubber claims (proxy/core/scrub.py): raw, percent (upper and
    lower hex), form-encoded, JSON (per character, surrogate pairs beyond the BMP), base64 alone
    and at each alignment, and for a non-ASCII value its per-byte JSON, mojibake and Latin-1."""
    raw = value.encode()
    out = [
        raw,
        quote(value, safe="").encode(),
        "".join(f"%{c:02x}" for c in raw).encode(),
        quote_plus(value).encode(),
        json.dumps(value).encode(),
        re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m[1].upper(), json.dumps(value)).encode(),
        base64.b64encode(raw),
        base64.urlsafe_b64encode(raw).rstrip(b"="),
        *(base64.b64encode(b"x" * k + raw + b"yz") for k in (1, 2, 3)),
        "".join(f"\\u{c:04x}" for c in raw).encode(),
        raw.decode("latin-1").encode(),
    ]
    if all(ord(c) < 0x100 for c in value):
        out.append(value.encode("latin-1"))
    return out


def _reflect_all(request: bytes) -> bytes:
    """Every request header value the upstream got, reflected into every part of an HTTP/1
    response: the reason phrase, a header name, header values, the body (every spelling) and a
    trailer (dropped by the proxy)."""
    head = request.split(b"\r\n\r\n", 1)[0].decode("utf-8", "surrogateescape").split("\r\n")[1:]
    values = [
        line.split(":", 1)[1].strip()
        for line in head
        if line.lower().startswith(("authorization:", "x-uni:"))
    ]
    token = values[0].removeprefix("Bearer ") if values else "-"
    body = b"\n".join(line for v in values for line in _reflected(v)) + b"\n"
    return (
        f"HTTP/1.1 200 {token}\r\nX-{token}: 1\r\n".encode()
        + b"".join(b"X-Echo: " + v.encode() + b"\r\n" for v in values)
        + b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\nX-T: %s\r\n\r\n" % (len(body), body, token.encode())
    )


def _claimed(value: str) -> dict[str, bytes]:
    """What the module's canary scan looks for: tests/canary.py's forms and the scrubber's own."""
    forms = dict(canary.forms(value))
    raw = value.encode()
    forms |= {
        "json-per-char": json.dumps(value)[1:-1].encode(),
        "percent-plus": quote(value).replace("%20", "+").encode(),
        "mojibake": raw.decode("latin-1").encode(),
    }
    if all(ord(c) < 0x100 for c in value):
        forms["latin-1"] = value.encode("latin-1")
    return forms


def _unicode_body(s: str) -> bytes:
    """A JSON body holding ``s`` in the spellings upstreams produce for a non-ASCII value."""
    raw = s.encode()
    lines = [
        raw,
        json.dumps(s).encode(),  # \u00e4 per character
        json.dumps(s, ensure_ascii=False).encode(),
        "".join(f"\\u{c:04x}" for c in raw).encode(),  # \u00c3\u00a4: per UTF-8 byte
        "".join(f"\\u{c:04X}" for c in raw).encode(),
        quote(s).encode(),
        "".join(f"%{c:02x}" for c in raw).encode(),  # every byte, lower-case hex
        raw.decode("latin-1").encode(),  # its UTF-8 read as Latin-1, written as UTF-8 ("Ã¤")
        base64.b64encode(raw),
    ]
    body = b"\n".join(lines) + b"\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    st = Stage(tmp_path_factory.mktemp("paths"))
    with st:
        secret = st.secret("resp", tag="paths", file="secret")
        uni = canary.register(f"CANARYuni{secrets.token_hex(8)}äöü€𝄞")
        canary.source(st.tmp / "secret-uni", uni)
        st.watch(uni)
        st.token("tok")
        raw = st.serve(RawUpstream(st.ca, ["api.test"]))
        raw.responses.update(_bodies(secret))
        raw.responses.update(_hostile(secret))
        raw.responses["/dribble"] = _dribble(secret)
        raw.responses["/unicode"] = _unicode_body(uni)
        raw.responses["/reflect-all"] = _reflect_all
        raw.responses["/upload"] = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ngot\n"
        raw.responses["/ok"] = lambda req: (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n"
            + (b"" if req.startswith(b"HEAD ") else b"ok\n")
        )
        h2 = st.serve(H2Trailers(st.ca, st.tmp, secret))
        ws = st.enter(WsReflect(st.ca))
        text = rules(
            [egress("api.test", ports=[raw.port, h2.port, ws.port])],
            claim_id="c",
            credentials=[
                credential("resp", PH, ["api.test"], "file:secret"),
                # X-Uni is not a default slot (proxy/core/slots.py)
                credential("uni", PH_UNI, ["api.test"], headers=["X-Uni"]),
            ],
        )
        yield World(st.proxy(text, ["api.test"]), raw, h2, ws, secret, uni, st.received)
    found = [f"{what}: {name}" for what, data in st.artifacts().items() for v in (secret, uni)
             for name, form in _claimed(v).items() if form in data]  # fmt: skip
    assert not found, found


# -- issue 20 item 1: bodiless responses keep their framing -------------------------------------


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/204", "204"),
        ("GET", "/304", "304"),
        ("HEAD", "/ok", "200"),
        ("GET", "/304te", "304"),
        # mitmproxy refuses a 204 with Transfer-Encoding (a smuggling defence): a 502, and the
        # client's connection is closed, so the next request opens a new one
        ("GET", "/204te", "502"),
    ],
    ids=["204", "304", "HEAD", "304-chunked", "204-chunked"],
)
def test_a_bodiless_response_leaves_the_kept_alive_connection_usable(
    world: World, method: str, path: str, code: str, proto: str
) -> None:
    """curl, two requests on one connection: the second succeeds after a 204, a 304 or a HEAD
    (also when the upstream framed it as chunked, which RFC 9112 §6.1 forbids)."""
    head = ["-I"] if method == "HEAD" else []
    done = world.twice(proto, ["-X", method, *head], world.raw_url(path), world.raw_url("/ok"))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert b"HTTP/0.9" not in done.stderr
    assert f"code={code} connects=1" in out
    reused = 0 if code != "502" or proto == "--http2" else 1
    assert out.rstrip().endswith(f"ok\n\ncode=200 connects={reused}"), out  # the second reused the tunnel
    if code != "502":
        assert "transfer-encoding" not in out.split("code=")[0].lower()
    if method == "HEAD":
        assert "content-length: 3" in out.lower()


@pytest.mark.parametrize("path", ["/early", "/early-many"])
@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_an_early_hints_response_is_not_taken_for_the_final_one(world: World, path: str, proto: str) -> None:
    done = world.curl(proto, "-D", "-", "-w", "\ncode=%{http_code}\n", world.raw_url(path))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert out.rstrip().endswith("final\n\ncode=200"), out
    assert " 103" not in out and " 102" not in out  # dropped, as mitmproxy drops HTTP/2 1xx


# -- issue 20 item 4: HTTP/1 trailers ---------------------------------------------------------


def test_an_http1_response_with_trailers_is_answered_at_once_trailers_dropped(world: World) -> None:
    start = time.monotonic()
    done = world.twice("--http1.1", [], world.raw_url("/trailers"), world.raw_url("/ok"))
    elapsed = time.monotonic() - start
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "hello\n\ncode=200 connects=1" in out and out.rstrip().endswith("ok\n\ncode=200 connects=0"), out
    assert "x-trailer:" not in out.lower()
    assert elapsed < 8, f"{elapsed:.1f}s"


def test_an_http1_request_with_trailers_is_forwarded_without_them(world: World) -> None:
    start = time.monotonic()
    data = world.tunnel(
        b"POST /upload HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"4\r\nbody\r\n0\r\nX-Req-Trailer: " + PH.encode() + b"\r\n\r\n"
    )
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert time.monotonic() - start < 8
    got = [r for r in world.raw.requests if r.startswith(b"POST /upload")]
    assert len(got) == 1 and b"body" in got[0] and b"X-Req-Trailer" not in got[0]


# -- issue 13 class 2: every byte that comes back is scrubbed ----------------------------------


def test_http2_trailers_are_scrubbed(world: World) -> None:
    done = world.curl("--http2", "-H", "TE: trailers", "-D", "-", f"https://api.test:{world.h2.port}/t")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "h2 body" in out and world.secret not in out
    assert f"x-trailer: Bearer {PH}" in out, out
    assert f"x-{PH.lower()}: 1" in out, out


def test_the_reason_phrase_and_header_names_are_scrubbed(world: World) -> None:
    done = world.curl("--http1.1", "-D", "-", world.raw_url("/reason"))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert world.secret not in out
    head = out.split("\r\n\r\n")[1]  # after the CONNECT's answer
    assert head.startswith(f"HTTP/1.1 200 {PH}"), head
    assert f"\nX-{PH}: v" in head and f"\n{PH}: w" in head


def test_the_304_and_204_heads_are_scrubbed(world: World) -> None:
    for path in ("/204", "/304"):
        out = world.curl("-D", "-", world.raw_url(path)).stdout.decode()
        assert world.secret not in out and PH in out


def test_a_non_ascii_secret_is_scrubbed_in_every_spelling(world: World) -> None:
    done = world.curl(world.raw_url("/unicode"))
    assert done.returncode == 0, done.stderr.decode()
    assert canary.find(done.stdout, [world.uni]) == []
    assert done.stdout.count(PH_UNI.encode()) == 8, done.stdout.decode("utf-8", "replace")
    assert base64.b64encode(PH_UNI.encode()) in done.stdout


def test_websocket_messages_and_the_101_head_are_scrubbed(world: World) -> None:
    ctx = ssl.create_default_context(cafile=world.proxy.ca_pem)
    got: list[bytes] = []
    with connect(
        f"wss://api.test:{world.ws.port}/ws",
        proxy=world.proxy.url("c", "tok"),
        ssl=ctx,
        additional_headers={"Authorization": f"Bearer {PH}"},
        open_timeout=30,  # a loaded 2-core machine
    ) as ws:
        assert ws.response is not None
        head = "\n".join(f"{k}: {v}" for k, v in ws.response.headers.raw_items())
        got.append(head.encode())
        for _ in range(3):
            ws.send("go")
            text, binary = ws.recv(timeout=10), ws.recv(timeout=10)
            assert isinstance(text, str) and isinstance(binary, bytes)
            got += [text.encode(), binary]
    world.received += got
    assert world.ws.auth == [f"Bearer {world.secret}"]  # the upstream did get (and reflect) it
    assert canary.find(b"\n".join(got), [world.secret]) == []
    assert f"X-Echo: Bearer {PH}" in head and f"X-{PH}: 1" in head
    assert PH.encode() in got[1] and got[2].startswith(b"\x00\x01binary:") and PH.encode() in got[2]


def test_websocket_ping_pong_and_close_frames_from_the_upstream_are_scrubbed(world: World) -> None:
    """A raw client (wsproto over the CONNECT tunnel) sees every frame, control frames too."""
    client = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    auth = base64.b64encode(b"c:tok").decode()
    host = f"api.test:{world.ws.port}"
    raw, events = b"", []
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as sock:
        sock.sendall(
            f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        with ctx.wrap_socket(sock, server_hostname="api.test") as tls:
            tls.sendall(
                client.send(
                    wse.Request(
                        host=host, target="/ws", extra_headers=[(b"authorization", f"Bearer {PH}".encode())]
                    )
                )
            )
            closed = False
            while not closed:
                data = tls.recv(65536)
                if not data:
                    break
                raw += data
                client.receive_data(data)
                for event in client.events():
                    events.append(event)
                    if isinstance(event, wse.AcceptConnection):
                        tls.sendall(client.send(wse.TextMessage("control")))
                    elif isinstance(event, wse.CloseConnection):
                        closed = True
    world.received.append(raw)
    assert canary.find(raw, [world.secret]) == []
    pings = [bytes(e.payload) for e in events if isinstance(e, wse.Ping)]
    pongs = [bytes(e.payload) for e in events if isinstance(e, wse.Pong)]
    closes = [(e.code, e.reason) for e in events if isinstance(e, wse.CloseConnection)]
    assert pings == [f"ping {PH}".encode()] and pongs == [PH.encode()], events
    assert closes == [(4000, f"bye {PH}")], events


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_a_reflecting_upstream_hands_back_no_trace_of_either_secret(world: World, proto: str) -> None:
    """The placeholders go up, are swapped for the secrets (ASCII and not), and come back in
    the reason phrase, a header name, header values, a trailer and the body in every spelling."""
    done = world.curl(proto, "-D", "-", "-H", f"Authorization: Bearer {PH}", "-H", f"X-Uni: {PH_UNI}",
                      world.raw_url("/reflect-all"))  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    got = [r for r in world.raw.requests if b"/reflect-all" in r.split(b"\r\n", 1)[0]][-1]
    assert world.secret.encode() in got and world.uni.encode() in got  # the upstream did get both
    out = done.stdout
    for value in (world.secret, world.uni):
        assert not [n for n, f in _claimed(value).items() if f in out], value[:10]
    assert out.count(PH.encode()) >= 10 and out.count(PH_UNI.encode()) >= 7, out.decode("utf-8", "replace")
    if proto == "--http1.1":
        assert f"HTTP/1.1 200 {PH}".encode() in out and f"X-{PH}: 1".encode() in out


def test_an_http10_client_gets_a_scrubbed_body_without_chunked_framing(world: World) -> None:
    """RFC 9112 §6.1: no Transfer-Encoding toward an HTTP/1.0 client; a scrubbed body (its
    length changed) ends with the connection instead."""
    done = world.curl("--http1.0", "-D", "-", world.raw_url("/unicode"))
    out = done.stdout
    assert done.returncode == 0, done.stderr.decode()
    head, _, body = out.partition(b"\r\n\r\n")[2].partition(b"\r\n\r\n")
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower(), head
    assert body.count(PH_UNI.encode()) == 8 and body.endswith(b"\n")


# -- review r4: a hostile upstream in odd corners of HTTP/1 --------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/te-gzip", "/te-deflate", "/fold", "/chunk-ext", "/long-header", "/redirect", "/early-flood",
     "/ce-nested", "/ce-twice", "/ce-br", "/multipart"],
)  # fmt: skip
def test_a_hostile_upstream_gets_no_trace_of_the_secret_to_the_sandbox(world: World, path: str) -> None:
    """The raw bytes the client gets through its tunnel, and its body undone of any chunked,
    gzip, deflate or br coding (a sandbox can decode what its client did not), hold no form of
    the secret."""
    head = f"GET {path} HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: gzip, br\r\nConnection: close\r\n\r\n"
    data = world.tunnel(head.encode())
    world.received.append(_decoded_bodies(data))
    assert canary.find(data + _decoded_bodies(data), [world.secret]) == [], data[:300]


@pytest.mark.parametrize("path", ["/te-gzip", "/te-deflate"])
def test_a_body_with_a_transfer_coding_other_than_chunked_is_refused_and_audited(
    world: World, path: str
) -> None:
    """RFC 9112 §7: ``Transfer-Encoding: gzip, chunked``. mitmproxy undoes the chunks only; the
    body, still gzip, would reach the sandbox unscanned: the connection is closed instead."""
    data = world.tunnel(f"GET {path} HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n".encode())
    assert b"\x1f\x8b" not in data and b"0\r\n\r\n" not in data, data[:300]
    deadline = time.monotonic() + 30
    while not (events := [e for e in world.proxy.audit_events() if e.get("path") == path]):
        assert time.monotonic() < deadline, world.proxy.audit_events()
        time.sleep(0.05)
    assert all(e["reason"] == "unscannable_response" for e in events), events
    assert all("Transfer-Encoding" in e["message"] for e in events), events


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_a_flood_of_early_hints_is_not_taken_for_the_final_response(world: World, proto: str) -> None:
    """200 ``103`` heads in one read, then the final ``200``: the client gets the ``200``, and
    its connection stays usable for a second request."""
    done = world.twice(proto, [], world.raw_url("/early-flood"), world.raw_url("/ok"))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert " 103" not in out, out[:500]
    assert "final\n\ncode=200 connects=1" in out and out.rstrip().endswith("ok\n\ncode=200 connects=0"), out


HOSTILE = ["/fold", "/chunk-ext", "/long-header", "/redirect", "/early-flood", "/ce-nested", "/ce-twice",
           "/ce-br", "/multipart", "/te-gzip", "/te-deflate"]  # fmt: skip


@pytest.mark.parametrize("path", HOSTILE)
def test_a_hostile_upstream_gets_no_trace_of_the_secret_to_an_http2_client(world: World, path: str) -> None:
    """The same answers toward an HTTP/2 client (curl, which leaves the body as it came)."""
    done = world.curl("--http2", "-D", "-", world.raw_url(path))
    body = done.stdout.partition(b"\r\n\r\n")[2]
    undone = [body]
    for undo in (lambda d: zlib.decompressobj(47).decompress(d), zlib.decompress, brotli.decompress):
        with contextlib.suppress(Exception):  # not in that coding
            undone.append(undo(body.partition(b"\r\n\r\n")[2]))
    world.received += undone
    got = done.stdout + done.stderr + b"\n".join(undone)
    assert canary.find(got, [world.secret]) == [], done.stdout[:300]


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_a_head_response_framed_as_chunked_leaves_the_connection_usable(world: World, proto: str) -> None:
    """HEAD, answered with ``Transfer-Encoding: chunked`` and no body (RFC 9112 §6.3): the next
    request on the connection gets its own answer, and the head is scrubbed."""
    done = world.twice(proto, ["-I"], world.raw_url("/head-te"), world.raw_url("/ok"))
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert b"HTTP/0.9" not in done.stderr
    assert "code=200 connects=1" in out and out.rstrip().endswith("ok\n\ncode=200 connects=0"), out
    assert canary.find(done.stdout, [world.secret]) == []
    assert f"x-echo: {PH.lower()}" in out.lower()


def test_a_websocket_message_in_many_frames_is_scrubbed_whole(world: World) -> None:
    """The upstream splits each message over several frames (FIN on the last), the secret across
    frame boundaries, raw and inside base64; permessage-deflate as the client offers it."""
    ctx = ssl.create_default_context(cafile=world.proxy.ca_pem)
    with connect(
        f"wss://api.test:{world.ws.port}/ws",
        proxy=world.proxy.url("c", "tok"),
        ssl=ctx,
        additional_headers={"Authorization": f"Bearer {PH}"},
        open_timeout=30,  # a loaded 2-core machine
    ) as ws:
        ws.send("fragments")
        got = [ws.recv(timeout=10) for _ in range(3)]
        extensions = ws.protocol.extensions
    data = [g.encode() if isinstance(g, str) else g for g in got]
    world.received += data
    assert extensions, "permessage-deflate was not negotiated"
    assert canary.find(b"\n".join(data), [world.secret]) == []
    assert data[0] == f"text:{PH}:end".encode() and data[1] == f"bin:{PH}:end".encode()
    assert PH.encode() in base64.b64decode(data[2])


@pytest.mark.parametrize("path", ["/304-body", "/204-body", "/head-body"])
@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_bytes_after_a_bodiless_answer_reach_neither_the_next_answer_nor_the_log(
    world: World, path: str, proto: str
) -> None:
    """The upstream sends a body after a 304 (or 204), holding the secret: the second request on
    the client's connection gets its own answer, and the stray bytes (which mitmproxy quotes in
    its log and error messages) are in no byte the client gets or the proxy writes."""
    first = ["-I"] if path == "/head-body" else []
    done = world.twice(proto, first, world.raw_url(path), world.raw_url("/ok"))
    out = done.stdout.decode()
    assert re.search(r"ok\n\ncode=200 connects=[01]$", out.rstrip()), out
    time.sleep(0.5)
    assert canary.find(done.stdout + done.stderr, [world.secret]) == []
    assert canary.find(world.proxy.stderr_path.read_bytes(), [world.secret]) == []
    assert canary.find(world.proxy.audit_path.read_bytes(), [world.secret]) == []


def test_an_sse_stream_that_writes_the_secret_one_byte_per_read_is_scrubbed(world: World) -> None:
    """Each byte of the secret (raw, JSON-escaped, inside base64) comes in its own chunk and read."""
    done = world.curl("-N", "--http1.1", world.raw_url("/dribble"))
    assert done.returncode == 0, done.stderr.decode()
    assert canary.find(done.stdout, [world.secret]) == []
    events = done.stdout.split(b"\n\n")
    assert events[0] == b"data: " + PH.encode(), events
    assert events[1] == b'data: {"t": "' + PH.encode() + b'"}', events
    assert PH.encode() in base64.b64decode(events[2].removeprefix(b"data: ")) and events[3] == b"data: tail"


def test_a_value_rotated_while_a_websocket_is_open_is_scrubbed_on_it(world: World) -> None:
    """A store credential's value is replaced while a WebSocket of its claim is open; the new
    value reaches the upstream on another connection, and the upstream broadcasts it on the old
    one: it comes back as the placeholder there too (the claim is read as it is now)."""
    old, new = canary.make("wsrot"), canary.make("wsrot")
    with control(world.proxy) as api:
        token = api.post("/v1/claims", json={"id": "wsrot", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/wsrot/credentials/k", json={"hosts": ["api.test"], "value": old})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
        ctx = ssl.create_default_context(cafile=world.proxy.ca_pem)

        def open_ws() -> Any:
            return connect(
                f"wss://api.test:{world.ws.port}/ws",
                proxy=world.proxy.url("wsrot", token),
                ssl=ctx,
                additional_headers={"Authorization": f"Bearer {placeholder}"},
                open_timeout=30,  # a loaded 2-core machine
            )

        with open_ws() as first:
            r = api.put("/v1/claims/wsrot/credentials/k", json={"hosts": ["api.test"], "value": new})
            assert r.status_code in (200, 201), r.text
            with open_ws():
                pass
            assert world.ws.auth[-1] == f"Bearer {new}"  # the upstream got the new value
            first.send("auths")
            got = first.recv(timeout=10)
    data = got.encode() if isinstance(got, str) else got
    world.received.append(data)
    assert canary.find(data, [old, new]) == []
    assert data.count(placeholder.encode()) >= 2


def _after_note(world: World) -> Any:
    """The SSE stream's next event: the Authorization /note got, once it got it."""

    def after_note() -> bytes:  # the stream's next event: what /note got, once it got it
        deadline = time.monotonic() + 15
        while not (notes := [r for r in world.raw.requests if r.startswith(b"GET /note")]):
            if time.monotonic() > deadline:
                return b"0\r\n\r\n"
            time.sleep(0.05)
        lines = [line.split(b": ", 1) for line in notes[-1].split(b"\r\n")[1:] if b": " in line]
        auth = next(v for n, v in lines if n.lower() == b"authorization")
        return _chunk(b"data: " + auth + b"\n\n") + _chunk(b"data: tail\n\n") + b"0\r\n\r\n"

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    world.raw.requests[:] = [r for r in world.raw.requests if not r.startswith(b"GET /note")]
    world.raw.responses["/sse-rot"] = [head, _chunk(b"data: one\n\n"), after_note]
    world.raw.responses["/note"] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
    return after_note


def test_a_value_rotated_while_an_sse_stream_is_open_is_scrubbed_in_it(world: World) -> None:
    """A store credential's value is replaced while a response of its claim streams; the new
    value reaches the upstream on another connection and comes back in the open stream: as the
    placeholder (the claim is read as it is now, each read)."""
    old, new = canary.make("sserot"), canary.make("sserot")
    _after_note(world)
    with control(world.proxy) as api:
        token = api.post("/v1/claims", json={"id": "sserot", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/sserot/credentials/k", json={"hosts": ["api.test"], "value": old})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
        curl = ["curl", "-sS", "-N", "--max-time", "20", "-x", world.proxy.url("sserot", token), "--cacert",
                str(world.proxy.ca_pem), "-H", f"Authorization: Bearer {placeholder}"]  # fmt: skip
        with subprocess.Popen([*curl, world.raw_url("/sse-rot")], stdout=subprocess.PIPE) as stream:
            assert stream.stdout is not None
            assert stream.stdout.readline() == b"data: one\n"  # the stream is open
            r = api.put("/v1/claims/sserot/credentials/k", json={"hosts": ["api.test"], "value": new})
            assert r.status_code in (200, 201), r.text
            subprocess.run([*curl, world.raw_url("/note")], capture_output=True, timeout=30, check=True)
            out = stream.stdout.read()
    world.received.append(out)
    assert canary.find(out, [old, new]) == []
    assert f"data: Bearer {placeholder}".encode() in out and out.endswith(b"data: tail\n\n"), out


def test_a_file_value_rotated_while_an_sse_stream_is_open_is_scrubbed_in_it(world: World) -> None:
    """The same for a rules-file credential (``file:``, re-read on change under the same claim
    object). Runs last: it rotates the module's secret, and puts it back."""
    _after_note(world)
    new = canary.make("filerot")
    secret_file = world.proxy.rules.parent / "secret"
    curl = ["curl", "-sS", "-N", "--max-time", "20", "-x", world.proxy.url("c", "tok"), "--cacert",
            str(world.proxy.ca_pem), "-H", f"Authorization: Bearer {PH}"]  # fmt: skip
    try:
        with subprocess.Popen([*curl, world.raw_url("/sse-rot")], stdout=subprocess.PIPE) as stream:
            assert stream.stdout is not None
            assert stream.stdout.readline() == b"data: one\n"
            canary.source(secret_file, new)
            time.sleep(1.5)
            subprocess.run([*curl, world.raw_url("/note")], capture_output=True, timeout=30, check=True)
            out = stream.stdout.read()
    finally:
        canary.source(secret_file, world.secret)
    world.received.append(out)
    note = [r for r in world.raw.requests if r.startswith(b"GET /note")][-1]
    assert new.encode() in note  # the upstream got the new value
    assert canary.find(out, [new, world.secret]) == []
    assert f"data: Bearer {PH}".encode() in out and out.endswith(b"data: tail\n\n"), out
