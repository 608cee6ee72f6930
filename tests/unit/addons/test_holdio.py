"""addons/holdio.py: the pauses of a client connection's reading nest (a request head parsed
while the connection's next layer is chosen must stay paused when the outer hook ends), on a
real asyncio socket transport; a peer that shuts its side is seen as gone while unread."""

from __future__ import annotations

import asyncio
import select
import socket

import pytest
from mitmproxy.test import tflow

from addons import holdio


async def test_pauses_nest_and_the_last_release_resumes() -> None:
    ours, theirs = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=ours)
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport) and transport.is_reading()
        holdio.hold(transport, reader)  # next_layer
        holdio.hold(transport, reader)  # requestheaders, started inside it
        holdio.release(transport)  # next_layer done
        assert not transport.is_reading()
        theirs.sendall(b"body")
        await asyncio.sleep(0.05)
        assert not reader._buffer  # type: ignore[attr-defined]  # nothing read while held
        holdio.release(transport)
        assert transport.is_reading()
        assert await asyncio.wait_for(reader.read(4), 2) == b"body"
        holdio.release(transport)  # one too many: harmless
        assert transport.is_reading()
        writer.close()
    finally:
        theirs.close()


def test_a_peer_that_shut_its_side_is_gone_with_data_unread() -> None:
    ours, theirs = socket.socketpair()
    try:
        poll = select.poll()
        poll.register(ours.fileno(), holdio._GONE)
        theirs.sendall(b"unread body bytes")
        assert not any(ev & holdio._GONE for _, ev in poll.poll(0))
        theirs.shutdown(socket.SHUT_WR)
        assert any(ev & holdio._GONE for _, ev in poll.poll(0))
    finally:
        ours.close()
        theirs.close()


# which held requests stop their connection's reading (review r-approve): any that may still
# carry a body (HTTP/1 by its framing, RFC 9112 §6.3; HTTP/2 unless Content-Length: 0)
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
    assert holdio.has_body(flow) is expected
