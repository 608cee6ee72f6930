"""Request-head hygiene, one row per rule."""

from __future__ import annotations

import pytest

from proxy.core.hygiene import MAX_HEAD_BYTES, MAX_HEADERS, check_head, transfer_coded

H = list[tuple[bytes, bytes]]


@pytest.mark.parametrize(
    ("fields", "method", "credentialed", "status"),
    [
        ([(b"Host", b"a.test")], "GET", False, 0),
        ([(b"Host", b"a.test"), (b"host", b"b.test")], "GET", False, 400),
        ([(b"Host", b"a.test"), (b"X-A", b"1\r\nX-B: 2")], "GET", False, 400),
        ([(b"Host", b"a.test"), (b"X-A", b"a\x00b")], "GET", False, 400),
        ([(b"Host", b"a.test"), (b"X-A", b"tab\tis fine")], "GET", False, 0),
        ([(b"X-%d" % i, b"v") for i in range(MAX_HEADERS + 1)], "GET", False, 431),
        ([(b"X-Big", b"v" * MAX_HEAD_BYTES)], "GET", False, 431),
        ([(b"Host", b"a.test")], "TRACE", True, 405),
        ([(b"Host", b"a.test")], "TRACE", False, 0),
        ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"chunked")], "POST", False, 0),
        ([(b"Host", b"a.test"), (b"transfer-encoding", b" Chunked ")], "POST", False, 0),
        ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"gzip, chunked")], "POST", False, 501),
        ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"deflate,chunked")], "POST", False, 501),
        ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"compress ,\tchunked")], "POST", False, 501),
        ([(b"Host", b"a.test"), (b"TRANSFER-ENCODING", b"GZIP, CHUNKED")], "POST", False, 501),
        ([(b"Host", b"a.test"), (b"Transfer-Encoding", b"gzip")], "POST", False, 501),
        ([(b"Host", b"a.test"), (b"Content_Length", b"5")], "POST", False, 400),
        ([(b"Host", b"a.test"), (b"transfer_encoding", b"chunked")], "POST", False, 400),
        ([(b"Host", b"a.test"), (b"HOST_", b"b.test")], "GET", False, 0),
        ([(b"Host", b"a.test"), (b"Connection", b"x"), (b"Keep_Alive", b"1")], "GET", False, 400),
        ([(b"Host", b"a.test"), (b"Proxy_Authorization", b"Basic eDp5")], "GET", False, 400),
        ([(b"Host", b"a.test"), (b"X_Api_Key", b"v"), (b"Upgrade_Insecure_Requests", b"1")], "GET", False, 0),
    ],
    ids=[
        "fine",
        "duplicate-host",
        "crlf-in-value",
        "nul-in-value",
        "htab-allowed",
        "too-many-fields",
        "head-too-large",
        "trace-to-credentialed-host",
        "trace-elsewhere",
        "chunked",
        "chunked-odd-case-and-space",
        "gzip-then-chunked",
        "deflate-then-chunked",
        "compress-then-chunked-with-whitespace",
        "upper-case-gzip-then-chunked",
        "gzip-alone",
        "content-length-with-underscore",
        "transfer-encoding-with-underscore",
        "host-with-a-trailing-underscore-is-another-name",
        "keep-alive-with-underscore",
        "proxy-authorization-with-underscore",
        "other-underscore-names-pass",
    ],
)
def test_check_head(fields: H, method: str, credentialed: bool, status: int) -> None:
    assert check_head(fields, method, credentialed).status == status


def test_hop_by_hop_and_connection_nominated_headers_are_dropped() -> None:
    fields = [
        (b"Host", b"a"),
        (b"Connection", b"close, X-Hop"),
        (b"X-Hop", b"1"),
        (b"Keep-Alive", b"5"),
        (b"TE", b"trailers"),
        (b"X-Keep", b"1"),
    ]
    assert check_head(fields, "GET", False).drop == {b"x-hop", b"keep-alive"}


def test_websocket_upgrade_keeps_connection_and_upgrade() -> None:
    fields = [(b"Host", b"a"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")]
    assert check_head(fields, "GET", False).drop == frozenset()


@pytest.mark.parametrize(
    "protocol", [b"h2c", b"TLS/1.2", b"raw-echo", b"websocket, h2c", b"h2c, websocket", b""]
)
def test_an_upgrade_to_another_protocol_than_websocket_is_dropped(protocol: bytes) -> None:
    """Review r5: only a WebSocket upgrade is offered upstream (RFC 9110 §7.8)."""
    fields = [
        (b"Host", b"a"),
        (b"Connection", b"Upgrade, HTTP2-Settings"),
        (b"Upgrade", protocol),
        (b"HTTP2-Settings", b"AAMAAABkAARAAAAAAAIAAAAA"),
    ]
    assert check_head(fields, "GET", False).drop == {b"upgrade", b"http2-settings"}


# --- the request line / HTTP/2 pseudo-header fields (issue 20) --------------------------------

# every byte that may not stand in a request line: controls, space, DEL, and each non-ASCII byte
_NOT_IN_A_LINE = [bytes([b]) for b in [*range(0x21), 0x7F, *range(0x80, 0x100)]]


def test_check_request_line_accepts_ordinary_requests() -> None:
    from proxy.core.hygiene import check_request_line

    for method, scheme, authority, path in [
        (b"GET", b"https", b"", b"/"),
        (b"POST", b"https", b"api.test:443", b"/v1/x?a=b&c=%20d#f"),
        (b"PROPFIND", b"http", b"[::1]:8080", b"/~user/;p=1"),
        (b"OPTIONS", b"https", b"a.test", b"*"),
    ]:
        assert check_request_line(method, scheme, authority, path, True).status == 0


@pytest.mark.parametrize("where", ["method", "scheme", "authority", "path"])
@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
def test_check_request_line_refuses_any_byte_not_allowed_in_a_request_line(where: str, http2: bool) -> None:
    from proxy.core.hygiene import check_request_line

    base = {"method": b"GET", "scheme": b"https", "authority": b"a.test", "path": b"/p"}
    for bad in _NOT_IN_A_LINE:
        parts = dict(base, **{where: base[where][:1] + bad + base[where][1:]})
        verdict = check_request_line(
            parts["method"], parts["scheme"], parts["authority"], parts["path"], http2
        )
        assert verdict.status == 400, (where, bad)
        assert (":" + ("path" if where == "path" else where) in verdict.message) == http2


@pytest.mark.parametrize(
    ("method", "scheme", "authority", "path"),
    [
        (b"", b"https", b"", b"/"),
        (b"GET", b"", b"", b"/"),
        (b"GET", b"ftp", b"", b"/"),
        (b"GET", b"https", b"user@a.test", b"/"),
        (b"GET", b"https", b"", b""),
        (b"GET", b"https", b"", b"http://evil.test/"),
        (b"GET", b"https", b"", b"*"),
        (b"GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\nGET", b"https", b"", b"/"),
    ],
    ids=[
        "empty-method",
        "empty-scheme",
        "ftp",
        "userinfo",
        "empty-path",
        "absolute-path",
        "star-not-options",
        "request-in-method",
    ],
)
def test_check_request_line_refuses_malformed_parts(
    method: bytes, scheme: bytes, authority: bytes, path: bytes
) -> None:
    from proxy.core.hygiene import check_request_line

    assert check_request_line(method, scheme, authority, path, True).status == 400



@pytest.mark.parametrize(
    ("values", "coded"),
    [
        ([], False),
        ([b"chunked"], False),
        ([b"Chunked"], False),
        ([b"identity"], False),
        ([b"gzip, chunked"], True),
        ([b"GZIP,chunked"], True),
        ([b"deflate, chunked"], True),
        ([b"compress, chunked"], True),
        ([b"gzip"], True),
        ([b"x-custom, chunked"], True),
        ([b"gzip", b"chunked"], True),  # two fields are one list (RFC 9110 §5.3)
        ([b"chunked", b"br"], True),
    ],
)
def test_a_response_transfer_coding_other_than_chunked_is_found(values: list[bytes], coded: bool) -> None:
    """RFC 9112 §7: a coding other than chunked, in any field of the list, in any case."""
    fields = [(b"Content-Type", b"text/plain"), *((b"Transfer-Encoding", v) for v in values)]
    assert bool(transfer_coded(fields)) is coded
