"""addons/holdio.py: the pauses of a client connection's reading nest (a request head parsed
while the connection's next layer is chosen must stay paused when the outer hook ends), on a
real asyncio socket transport; a peer that shuts its side is seen as gone while unread."""

from __future__ import annotations

import asyncio
import select
import socket

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
