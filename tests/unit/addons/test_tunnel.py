"""addons/tunnel.py ``looks_like_http``: what an intercepted connection's first bytes are judged
to be. True: an HTTP/1 request line; False: not HTTP (refused); None: wait for more bytes."""

from __future__ import annotations

import pytest

from addons.tunnel import FIRST_LINE_LIMIT, looks_like_http

CASES = [
    (b"GET / HTTP/1.1\r\n", True, "request-line"),
    (b"POST /v1/x?y=1 HTTP/1.0\n", True, "request-line-lf-only"),
    (b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", True, "asterisk-form"),
    (b"GET https://a.test/x HTTP/1.1\r\n", True, "absolute-form-is-http-policy-decides-it"),
    (b"G", None, "one-byte"),
    (b"GE", None, "two-bytes"),
    (b"GET /v1/x", None, "target-not-ended"),
    (b"GET /v1/x HTTP/1.", None, "version-not-ended"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", False, "ssh-banner"),
    (b"SSH-", False, "ssh-banner-start"),
    (b"PING\r\n", False, "redis-inline-ping"),
    (b"*1\r\n$4\r\nPING\r\n", False, "redis-resp"),
    (b"EHLO sandbox\r\n", False, "smtp-ehlo"),
    (b"GET /\r\n", False, "http-0.9-no-version"),
    (b"GET / HTTP/1.1 extra\r\n", False, "junk-after-version"),
    (b"\x16\x03\x01\x02\x00", False, "tls-record"),
    (b"\x00\x01binary", False, "binary"),
    (b"GET  / HTTP/1.1\r\n", False, "double-space"),
    (b"A" * (FIRST_LINE_LIMIT + 1), False, "first-line-too-long"),
]


@pytest.mark.parametrize(("data", "expected"), [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_first_bytes_are_judged(data: bytes, expected: bool | None) -> None:
    assert looks_like_http(data) is expected
