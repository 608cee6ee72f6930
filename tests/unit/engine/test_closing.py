"""proxy/engine/closing.py: a connection handler cancelled outside its own clean-up still closes
its socket (mitmproxy 12.3 left it open when the cancellation hit its unguarded ``await``)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from mitmproxy.connection import Client, ConnectionState
from mitmproxy.proxy import server

from proxy.engine import closing


class _Handler:
    """What the wrapper touches of a ``ConnectionHandler``: its ``transports``."""

    def __init__(self) -> None:
        self.transports: dict[Any, server.ConnectionIO] = {}


def _client() -> Client:
    return Client(
        peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), timestamp_start=0, state=ConnectionState.OPEN
    )


async def _pair() -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    return theirs, reader, writer


def test_a_cancellation_that_escapes_the_loop_closes_the_socket_and_pops_the_transport() -> None:
    async def run() -> None:
        peer, reader, writer = await _pair()
        handler, conn = _Handler(), _client()
        handler.transports[conn] = server.ConnectionIO(handler=None, reader=reader, writer=writer)

        async def leaves_by_cancellation(self: Any, connection: Any) -> None:
            raise asyncio.CancelledError  # as from `await self.server_event(...)` waiting for its lock

        wrapped = closing._closing(leaves_by_cancellation)  # type: ignore[arg-type]
        with pytest.raises(asyncio.CancelledError):
            await wrapped(handler, conn)  # type: ignore[arg-type]
        assert conn not in handler.transports and conn.state is ConnectionState.CLOSED
        await asyncio.sleep(0.05)
        peer.settimeout(2)
        assert peer.recv(10) == b""  # the other side sees the close at once
        peer.close()

    asyncio.run(run())


def test_a_loop_that_cleaned_up_itself_is_left_alone() -> None:
    async def run() -> None:
        peer, reader, writer = await _pair()
        handler, conn = _Handler(), _client()

        async def cleans_up(self: Any, connection: Any) -> None:
            raise asyncio.CancelledError  # after popping its transport itself: nothing left to do

        wrapped = closing._closing(cleans_up)  # type: ignore[arg-type]
        with pytest.raises(asyncio.CancelledError):
            await wrapped(handler, conn)  # type: ignore[arg-type]
        assert conn.state is ConnectionState.OPEN and not writer.is_closing()
        writer.close()
        peer.close()

    asyncio.run(run())


def test_the_patch_is_installed_once() -> None:
    closing.close_on_cancel()
    first = server.ConnectionHandler.handle_connection
    closing.close_on_cancel()
    assert server.ConnectionHandler.handle_connection is first
    assert getattr(first, closing._WRAPPED)
