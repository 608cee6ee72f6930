"""addons/framing.py on mitmproxy's own upstream-side senders: the bytes written always match the
head's declared length; a body that would not is never completed (issue 20)."""

from __future__ import annotations

from typing import Any

import pytest
from mitmproxy import options
from mitmproxy.proxy import commands
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    ResponseProtocolError,
)
from mitmproxy.test import tflow, tutils

from addons import framing


@pytest.fixture(autouse=True)
def installed() -> None:
    framing.install()


def _client() -> Any:
    ctx = Context(tflow.tclient_conn(), options.Options())
    ctx.server = tflow.tserver_conn()
    return _http1.Http1Client(ctx)


def _run(layer: Any, *events: Any) -> tuple[bytes, list[Any]]:
    """What ``layer`` wrote to the upstream for ``events``, and its other commands."""
    wrote, other = b"", []
    for ev in events:
        for cmd in layer.send(ev):
            if isinstance(cmd, commands.SendData):
                wrote += cmd.data
            else:
                other.append(cmd)
    return wrote, other


def _broken(other: list[Any]) -> bool:
    closed = any(isinstance(c, commands.CloseConnection) for c in other)
    failed = any(isinstance(c, ReceiveHttp) and isinstance(c.event, ResponseProtocolError) for c in other)
    return closed and failed


def test_install_is_idempotent() -> None:
    send = _http1.Http1Client.send
    framing.install()
    assert _http1.Http1Client.send is send


@pytest.mark.parametrize(
    ("length", "pieces"),
    [
        pytest.param("10", [b"0123456789", b"x"], id="past-the-length"),
        pytest.param("10", [b"0123456789x"], id="past-the-length-in-one-read"),
        pytest.param("10", [b"01234"], id="short-of-the-length"),
        pytest.param("0", [b"x"], id="zero-then-a-byte"),
    ],
)
def test_a_body_that_disagrees_with_its_content_length_is_never_completed(
    length: str, pieces: list[bytes]
) -> None:
    req = tutils.treq(
        method=b"POST", content=None, headers=((b"host", b"a.test"), (b"content-length", length.encode()))
    )
    layer = _client()
    events = [
        RequestHeaders(1, req, end_stream=False),
        *(RequestData(1, p) for p in pieces),
        RequestEndOfMessage(1),
    ]
    wrote, other = _run(layer, *events)
    head, _, body = wrote.partition(b"\r\n\r\n")
    assert b"content-length: " + length.encode() in head.lower()
    assert len(body) <= int(length)  # never a byte past the declared length
    assert _broken(other)


def test_a_body_that_matches_its_content_length_passes_unchanged() -> None:
    req = tutils.treq(
        method=b"POST", content=None, headers=((b"host", b"a.test"), (b"content-length", b"10"))
    )
    head = RequestHeaders(1, req, end_stream=False)
    wrote, other = _run(
        _client(), head, RequestData(1, b"01234"), RequestData(1, b"56789"), RequestEndOfMessage(1)
    )
    assert wrote.endswith(b"\r\n\r\n0123456789") and not _broken(other)


@pytest.mark.parametrize(
    "body", [b"", b"GET /smuggled HTTP/1.1\r\nHost: a.test\r\n\r\n"], ids=["no-body", "body"]
)
def test_an_http2_head_without_a_length_is_chunked_toward_http1_when_a_body_follows(body: bytes) -> None:
    req = tutils.treq(method=b"POST", http_version=b"HTTP/2.0", content=None, headers=((b"host", b"a.test"),))
    events: list[Any] = [RequestHeaders(1, req, end_stream=False)]
    events += [RequestData(1, body)] if body else []
    wrote, other = _run(_client(), *events, RequestEndOfMessage(1))
    head, _, rest = wrote.partition(b"\r\n\r\n")
    assert not _broken(other)
    if body:
        assert b"transfer-encoding: chunked" in head.lower()
        assert rest == b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        assert b"transfer-encoding" not in head.lower() and rest == b""


def test_content_length_beside_chunked_is_dropped() -> None:
    fields = ((b"host", b"a.test"), (b"transfer-encoding", b"chunked"), (b"content-length", b"3"))
    req = tutils.treq(method=b"POST", content=None, headers=fields)
    wrote, _ = _run(
        _client(), RequestHeaders(1, req, end_stream=False), RequestData(1, b"abcdef"), RequestEndOfMessage(1)
    )
    head, _, rest = wrote.partition(b"\r\n\r\n")
    assert b"content-length" not in head.lower() and rest == b"6\r\nabcdef\r\n0\r\n\r\n"


# --- toward an HTTP/2 upstream --------------------------------------------------------------------


def _h2_client() -> Any:
    from mitmproxy.proxy.layers.http import _http2

    opts = options.Options()
    opts.add_option("validate_inbound_headers", bool, True, "")
    opts.add_option("normalize_outbound_headers", bool, True, "")
    opts.add_option("http2_ping_keepalive", int, 58, "")
    ctx = Context(tflow.tclient_conn(), opts)
    ctx.server = tflow.tserver_conn()
    ctx.server.alpn = b"h2"
    layer = _http2.Http2Client(ctx)
    return layer


def _h2_upstream_sees(layer: Any, *events_: Any) -> tuple[list[Any], list[Any]]:
    """Run ``events_`` through ``layer`` (an Http2Client) and read what it wrote with a real h2
    server connection: (the h2 events the upstream would see, the layer's other commands)."""
    import h2.config
    import h2.connection
    from mitmproxy.proxy import events as pevents

    upstream = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    upstream.initiate_connection()
    seen, other = [], []
    for ev in (pevents.Start(), *events_):
        for cmd in layer.handle_event(ev):
            if isinstance(cmd, commands.SendData):
                seen += upstream.receive_data(cmd.data)
            elif not isinstance(cmd, commands.RequestWakeup | commands.Log):
                other.append(cmd)
    return seen, other


@pytest.mark.parametrize(
    ("pieces", "why"),
    [
        pytest.param([b"0123456789", b"x"], "past", id="past-the-length"),
        pytest.param([b"01234"], "short", id="short-of-the-length"),
    ],
)
def test_an_http2_upstream_never_gets_a_body_that_disagrees_with_its_content_length(
    pieces: list[bytes], why: str
) -> None:
    import h2.events

    req = tutils.treq(
        method=b"POST", http_version=b"HTTP/2.0", content=None, headers=((b"content-length", b"10"),)
    )
    req.authority = "a.test"
    events_ = [
        RequestHeaders(1, req, end_stream=False),
        *(RequestData(1, p) for p in pieces),
        RequestEndOfMessage(1),
    ]
    seen, other = _h2_upstream_sees(_h2_client(), *events_)
    received = sum(len(e.data) for e in seen if isinstance(e, h2.events.DataReceived))
    assert received <= 10
    assert not any(isinstance(e, h2.events.StreamEnded) for e in seen)  # never a whole request
    assert any(isinstance(e, h2.events.StreamReset) for e in seen)
    assert any(isinstance(c, ReceiveHttp) and isinstance(c.event, ResponseProtocolError) for c in other)
