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
