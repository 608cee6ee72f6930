"""addons/holdio.py's choice of which held requests stop their connection's reading: any that
may still carry a body (HTTP/1 by its framing, RFC 9112 §6.3; HTTP/2 unless Content-Length: 0)."""

from __future__ import annotations

import pytest
from mitmproxy.test import tflow

from addons.holdio import has_body


@pytest.mark.parametrize(
    ("version", "headers", "expected"),
    [
        ("HTTP/1.1", {}, False),
        ("HTTP/1.1", {"content-length": "0"}, False),
        ("HTTP/1.1", {"content-length": "12"}, True),
        ("HTTP/1.1", {"content-length": " 007 "}, True),
        ("HTTP/1.1", {"content-length": "x"}, True),  # malformed: fail closed (hygiene refuses it anyway)
        ("HTTP/1.1", {"transfer-encoding": "chunked"}, True),
        ("HTTP/1.1", {"transfer-encoding": "chunked", "content-length": "0"}, True),
        ("HTTP/2.0", {}, True),  # DATA may follow without a length
        ("HTTP/2.0", {"content-length": "0"}, False),
        ("HTTP/2.0", {"content-length": "5"}, True),
    ],
)  # fmt: skip
def test_a_request_that_may_carry_a_body_is_the_one_paused(
    version: str, headers: dict[str, str], expected: bool
) -> None:
    flow = tflow.tflow()
    flow.request.http_version = version
    flow.request.headers.clear()
    for k, v in headers.items():
        flow.request.headers[k] = v
    assert has_body(flow) is expected
