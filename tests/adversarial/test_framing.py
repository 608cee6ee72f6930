"""Malformed request framing is refused at once (issue 20 item 5): a chunk-size line two parsers
could read differently gets 400 and nothing reaches the upstream; an HTTP/2 request whose
pseudo-header fields hold a byte an HTTP/1 request line may not (space, control, DEL, non-ASCII)
gets 400 and is never written into an HTTP/1 request line (the upstream here speaks HTTP/1.1).

Defences: addons/chunks.py (mitmproxy's HTTP/1 body reader made strict) and proxy/core/hygiene.py
``check_request_line`` (through addons/hygiene.py). Clients are raw: bytes over a TLS socket in a
CONNECT tunnel for HTTP/1, the h2 library with its own checks off for HTTP/2.
"""

from __future__ import annotations

import gzip
import socket
import ssl
import time

import h2.config
import h2.connection
import h2.events
import pytest
from harness import World, status_line

# --- HTTP/2 pseudo-header fields ------------------------------------------------------------


def _h2_request(
    world: World, headers: list[tuple[bytes, bytes]], host: str = "other.test"
) -> tuple[int | None, str]:
    """Send one HTTP/2 request as given (the h2 library's own checks are off) through the tunnel,
    and return (status, what happened): the status is None when the stream was reset or the
    connection ended without a response."""
    with world.tls_tunnel(host, timeout=10, alpn="h2") as tls:
        config = h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        conn = h2.connection.H2Connection(config=config)
        conn.initiate_connection()
        conn.send_headers(1, headers, end_stream=True)
        tls.sendall(conn.data_to_send())
        status: int | None = None
        body = b""
        while True:
            try:
                data = tls.recv(65536)
            except (ConnectionError, ssl.SSLError, TimeoutError):
                return status, "connection error"
            if not data:
                return status, "closed"
            world.received.append(data)
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == 1:
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
                    return status, body.decode("utf-8", "replace")
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == 1:
                    return status, f"reset {event.error_code!r}"
                elif isinstance(event, h2.events.ConnectionTerminated):
                    return status, "goaway"
            tls.sendall(conn.data_to_send())


def _pseudo(world: World, path: bytes, **over: bytes) -> list[tuple[bytes, bytes]]:
    fields = {
        b":method": b"GET",
        b":scheme": b"https",
        b":authority": f"other.test:{world.upstream.port}".encode(),
        b":path": path,
    }
    fields.update({b":" + k.encode(): v for k, v in over.items()})
    return [*fields.items(), (b"user-agent", b"raw-h2")]


# each spelling a byte (or shape) no HTTP/1 request line may hold; ids say which
BAD_PSEUDO: list[tuple[str, bytes, str]] = [
    ("method", b"GET /smuggled HTTP/1.1", "method-space-request-line"),
    ("method", b"G\x01T", "method-ctl"),
    ("method", b"GE\x7fT", "method-del"),
    ("method", b"G\xc3\x89T", "method-non-ascii"),
    ("method", b"", "method-empty"),
    ("method", b"G\tET", "method-inner-htab"),
    ("path", b"/a b", "path-space"),
    ("path", b"/a\tb", "path-htab"),
    ("path", b"/a\x01b", "path-ctl"),
    ("path", b"/a\x7fb", "path-del"),
    ("path", b"/caf\xc3\xa9", "path-non-ascii"),
    ("path", b"/\x80", "path-byte-0x80"),
    ("path", b"http://evil.test/x", "path-absolute-form"),
    ("path", b"x", "path-no-slash"),
    ("scheme", b"ftp", "scheme-ftp"),
    ("scheme", b"ht tp", "scheme-space"),
    ("authority", b"other.test x", "authority-space"),
    ("authority", b"user@other.test", "authority-userinfo"),
    ("authority", b"other.test\x01", "authority-ctl"),
    ("authority", b"other.t\xc3\xa9st", "authority-non-ascii"),
]


@pytest.mark.parametrize(("field", "value"), [r[:2] for r in BAD_PSEUDO], ids=[r[2] for r in BAD_PSEUDO])
def test_http2_pseudo_headers_that_no_request_line_may_hold_get_400(
    world: World, field: str, value: bytes
) -> None:
    path = f"/h2-bad/{field}-{value.hex()}".encode()
    kw = {field: value} if field != "path" else {}
    headers = _pseudo(world, value if field == "path" else path, **kw)
    before = world.upstream.connections
    status, what = _h2_request(world, headers)
    assert status == 400, what
    assert world.upstream.connections == before
    assert not [r for r in world.upstream.requests if r.path.startswith("/h2-bad") or "smuggled" in r.path]


# What the h2 library refuses itself as malformed (RFC 9113 §8.2.1: NUL, CR, LF, whitespace at
# either end of a value): a connection error (GOAWAY, PROTOCOL_ERROR), as the RFC allows.
H2_REFUSES: list[tuple[str, bytes, str]] = [
    ("method", b"GET\t", "method-trailing-htab"),
    ("method", b"G\x00T", "method-nul"),
    ("path", b"/a HTTP/1.1\r\nX: y", "path-crlf"),
    ("scheme", b"https\x00", "scheme-nul"),
]


@pytest.mark.parametrize(("field", "value"), [r[:2] for r in H2_REFUSES], ids=[r[2] for r in H2_REFUSES])
def test_http2_fields_the_h2_library_refuses_end_the_connection(
    world: World, field: str, value: bytes
) -> None:
    path = f"/h2-bad/{field}-{value.hex()}".encode()
    kw = {field: value} if field != "path" else {}
    before = world.upstream.connections
    status, what = _h2_request(world, _pseudo(world, value if field == "path" else path, **kw))
    assert (status, what) == (None, "goaway")
    assert world.upstream.connections == before
    assert not [r for r in world.upstream.requests if r.path.startswith("/h2-bad")]


def test_a_clean_http2_request_still_passes(world: World) -> None:
    status, what = _h2_request(world, _pseudo(world, b"/h2-good?a=%20b"))
    assert status == 200, what
    assert world.paths("/h2-good") == ["/h2-good?a=%20b"]


# --- chunk-size lines (HTTP/1.1) ----------------------------------------------------------------


def _chunked_head(world: World, path: str) -> bytes:
    port = world.upstream.port
    return (
        f"POST {path} HTTP/1.1\r\nHost: other.test:{port}\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


REST = b"hello\r\n0\r\n\r\n"
BAD_CHUNKS: list[tuple[bytes, str]] = [
    (b"ffffffffffffffff1\r\n", "overflow-17-hex-digits"),
    (b"10000000000000000\r\n", "two-to-the-64"),
    (b"8000000000000000\r\n", "two-to-the-63"),
    (b"ffffffffffffffff\r\n", "sixteen-fs"),
    (b"00000000000000005\r\n", "17-digits-with-leading-zeros"),
    (b"zz\r\n", "non-hex"),
    (b"0x5\r\n", "0x-prefix"),
    (b"-5\r\n", "negative"),
    (b"+5\r\n", "plus-sign"),
    (b" 5\r\n", "leading-space"),
    (b"5 \r\n", "trailing-space"),
    (b"5\t\r\n", "trailing-htab"),
    (b"5junk\r\n", "trailing-junk"),
    (b"5;\r\n", "empty-extension"),
    (b"5;a=\r\n", "extension-without-value"),
    (b"5;a\x01=b\r\n", "extension-control-character"),
    (b'5;a="b\r\n', "extension-unclosed-quote"),
    (b"5;a=b\rc\r\n", "bare-cr-in-extension"),
    (b"5;a=\xc3\xa9\r\n", "extension-non-ascii"),
    (b"5\n", "bare-lf"),
    (b"\r\n", "empty-line"),
    (b"5;" + b"a" * 5000 + b"\r\n", "5000-byte-extension"),
    (b"0" * 5000, "5000-bytes-without-a-line-end"),
]


@pytest.mark.parametrize("line", [r[0] for r in BAD_CHUNKS], ids=[r[1] for r in BAD_CHUNKS])
def test_a_malformed_chunk_size_gets_400_and_nothing_is_forwarded(world: World, line: bytes) -> None:
    path = f"/chunk-bad/{line[:24].hex()}"
    before = world.upstream.connections
    data = world.tunnel_request(_chunked_head(world, path) + line + REST, host="other.test")
    assert status_line(data) == b"400", data[:300]
    assert b"bad_request_body" in data
    assert world.upstream.connections == before, "the head reached an upstream"
    assert world.paths(path) == []


GOOD_CHUNKS = [
    (b"5\r\n", "plain"),
    (b"000005\r\n", "leading-zeros"),
    (b"5;name=val\r\n", "extension"),
    (b'5;name = "quoted \\" val";flag\r\n', "extensions-with-whitespace-and-quoted-string"),
]


@pytest.mark.parametrize("line", [r[0] for r in GOOD_CHUNKS], ids=[r[1] for r in GOOD_CHUNKS])
def test_well_formed_chunk_size_lines_still_pass(world: World, line: bytes) -> None:
    path = f"/chunk-good/{line[:24].hex()}"
    data = world.tunnel_request(_chunked_head(world, path) + line + REST, host="other.test")
    assert status_line(data) == b"200", data[:300]
    [rec] = [r for r in world.upstream.requests if r.path == path]
    assert rec.body_len == 5


def test_a_malformed_chunk_after_good_ones_never_completes_the_request_upstream(world: World) -> None:
    """The head and the first chunk have gone on (the body streams); the bad line closes both
    connections, and the upstream never holds a whole request."""
    path = "/chunk-late"
    port = world.upstream.port
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT other.test:{port} HTTP/1.1\r\nHost: other.test:{port}\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        with ctx.wrap_socket(raw, server_hostname="other.test") as tls:
            tls.sendall(_chunked_head(world, path) + b"5\r\nfirst\r\n")
            time.sleep(0.5)  # the head and the first chunk are forwarded by now
            data = b""
            try:
                tls.sendall(b"ffffffffffffffff1\r\n" + b"x" * 1000 + b"\r\n0\r\n\r\n")
                while chunk := tls.recv(65536):
                    data += chunk
            except (ConnectionError, ssl.SSLError):
                pass
    world.received.append(data)
    assert status_line(data) == b"400", data[:300]
    time.sleep(0.3)
    assert world.paths(path) == []  # the upstream records a request only once its body is whole


# --- transfer-codings other than chunked (r2 review) --------------------------------------------

# mitmproxy 12.3 accepts these on a request and forwards them: the upstream then decodes a body
# the placeholder checks never read (they see the coded bytes), and a swap that re-frames the
# body as chunked drops the coding. Refused (501, RFC 9112 §6.1; a chunked request that is
# refused has its connection closed rather than its body read: addons/facts.py ``refuse``), and
# nothing reaches the upstream.
CODINGS = ["gzip, chunked", "deflate,chunked", "compress, chunked", "GZIP,\tChunked"]


@pytest.mark.parametrize("coding", CODINGS)
def test_a_transfer_coding_other_than_chunked_is_refused_and_nothing_is_forwarded(
    world: World, coding: str
) -> None:
    path = f"/te-coded/{coding.encode().hex()}"
    port = world.upstream.port
    body = gzip.compress(b"t=" + world.placeholder.encode())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: other.test:{port}\r\nTransfer-Encoding: {coding}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    before = world.upstream.connections
    data = world.tunnel_request(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body), host="other.test")
    assert data == b"", data[:300]
    event = world.proxy.wait_event(path=path)
    assert (event["decision"], event["reason"]) == ("deny", "bad_request_head"), event
    assert world.paths("/te-coded/") == []
    assert world.upstream.connections == before, "the head reached an upstream"
