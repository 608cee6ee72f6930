"""Framing fixes on mitmproxy's own test flows: trailers dropped where mitmproxy cannot send
them, a bodiless response's Transfer-Encoding dropped toward HTTP/1 clients (addons/h1read.py).
The reader wrappers are proved end to end in tests/e2e/test_response_paths.py."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tflow, tutils

from addons.h1read import Framing


def _flow(version: str, method: str = "GET", status: int = 200, te: bool = False) -> http.HTTPFlow:
    flow = tflow.tflow(req=tutils.treq(method=method.encode(), http_version=version.encode()), resp=True)
    assert flow.response is not None
    flow.response.status_code = status
    flow.response.http_version = version
    if te:
        flow.response.headers["Transfer-Encoding"] = "chunked"
    return flow


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/2.0"])
def test_request_trailers_are_always_dropped(version: str) -> None:
    flow = _flow(version)
    flow.request.trailers = http.Headers(x_placeholder="surr_AAAAAAAAAAAAAAAA")
    Framing().request(flow)
    assert not flow.request.trailers


@pytest.mark.parametrize(("version", "kept"), [("HTTP/1.1", False), ("HTTP/1.0", False), ("HTTP/2.0", True)])
def test_response_trailers_are_kept_only_toward_http2_clients(version: str, kept: bool) -> None:
    flow = _flow(version)
    assert flow.response is not None
    flow.response.trailers = http.Headers(grpc_status="0")
    Framing().response(flow)
    assert bool(flow.response.trailers) is kept


@pytest.mark.parametrize(
    ("version", "method", "status", "dropped"),
    [
        ("HTTP/1.1", "GET", 304, True),
        ("HTTP/1.1", "GET", 204, True),
        ("HTTP/1.1", "GET", 103, True),
        ("HTTP/1.1", "HEAD", 200, False),  # mitmproxy writes no last chunk after a HEAD response
        ("HTTP/1.1", "HEAD", 304, False),
        ("HTTP/1.1", "GET", 200, False),
        ("HTTP/2.0", "GET", 304, False),
    ],
)
def test_a_bodiless_response_loses_its_transfer_encoding_toward_http1(
    version: str, method: str, status: int, dropped: bool
) -> None:
    flow = _flow(version, method, status, te=True)
    Framing().responseheaders(flow)
    assert flow.response is not None
    assert ("transfer-encoding" not in flow.response.headers) is dropped


def _informational_by_full_parse(lines: list[bytearray]) -> bool:
    """The definition before issue 19's fast path: the whole head parsed by mitmproxy."""
    from mitmproxy.net.http import http1

    try:
        status = http1.read_response_head([bytes(x) for x in lines]).status_code
    except ValueError:
        return False
    return 100 <= status < 200 and status != 101


STATUS_LINES = [
    b"HTTP/1.1 200 OK", b"HTTP/1.1 100 Continue", b"HTTP/1.1 101 Switching Protocols",
    b"HTTP/1.1 103 Early Hints", b"HTTP/1.1 199", b"HTTP/1.1 0100 Continue", b"HTTP/1.1 1_00 x",
    b"HTTP/1.1 +100 x", b"HTTP/1.1  102  x", b"HTTP/1.1\t100\tx", b"HTTP/1.0 100 x", b"HTTP/2 100 x",
    b"HTTP/1.1 099 x", b"HTTP/1.1 200", b"HTTP/1.1", b"", b"HTTP/1.1 abc x", b"FOO/1.1 100 x",
    b"HTTP/1.1 -100 x", b"HTTP/1.1 \xd9\xa1\xd9\xa0\xd9\xa0 x",
]  # fmt: skip
HEADER_SETS = [[], [b"Link: </a.css>; rel=preload"], [b"no colon here"], [b" folded: x"], [b"X: \x00"]]


@pytest.mark.parametrize("status_line", STATUS_LINES)
@pytest.mark.parametrize("fields", HEADER_SETS, ids=["none", "link", "no-colon", "folded", "nul"])
def test_informational_check_agrees_with_the_full_parse(status_line: bytes, fields: list[bytes]) -> None:
    from addons.h1read import _is_informational

    lines = [bytearray(status_line), *(bytearray(f) for f in fields)]
    assert _is_informational(lines) is _informational_by_full_parse(lines)
