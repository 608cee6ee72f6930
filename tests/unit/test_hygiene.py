"""Request-head hygiene, one row per rule."""

from __future__ import annotations

import pytest

from proxy.hygiene import MAX_HEAD_BYTES, MAX_HEADERS, check_head

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
