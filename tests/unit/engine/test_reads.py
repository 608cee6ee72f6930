"""proxy/engine/reads.py: mitmproxy's per-event ``read(65535)`` on an upstream connection reads what
is there, up to 256 KiB (fewer layer passes per megabyte, issue 19), and still never waits for
more than is there; a client's connection keeps 64 KiB reads."""

from __future__ import annotations

import asyncio
import inspect
import socket
import time
from typing import Any

from mitmproxy.connection import Client, Connection, ConnectionState, Server
from mitmproxy.proxy import server

from proxy.engine import reads


class _Handler:
    def __init__(self) -> None:
        self.transports: dict[Any, server.ConnectionIO] = {}


def _client() -> Client:
    return Client(
        peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), timestamp_start=0, state=ConnectionState.OPEN
    )


def _server() -> Server:
    conn = Server(address=("127.0.0.1", 3))
    conn.state = ConnectionState.OPEN
    return conn


async def _reads_as_mitmproxy_does(sent: list[bytes], pause: float) -> list[tuple[int, float]]:
    """The wrapped handler reads as mitmproxy's loop does (``read(65535)`` per event) while the
    peer sends ``sent``, one piece each ``pause`` seconds; (bytes of each read, when it came)."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    handler, conn = _Handler(), _server()
    handler.transports[conn] = server.ConnectionIO(handler=None, reader=reader, writer=writer)
    got: list[tuple[int, float]] = []

    async def loop(self: Any, connection: Any) -> None:
        r = self.transports[connection].reader
        while data := await r.read(65535):
            got.append((len(data), time.monotonic()))

    async def peer() -> None:
        theirs.setblocking(False)
        for piece in sent:
            await asyncio.get_running_loop().sock_sendall(theirs, piece)
            await asyncio.sleep(pause)
        theirs.close()

    task = asyncio.create_task(reads._reading(loop)(handler, conn))  # type: ignore[arg-type]
    await peer()
    await asyncio.wait_for(task, 10)
    writer.close()
    return got


def _sizes_read(conn: Connection) -> list[int]:
    """Sizes of the reads of 1 MiB sent at once, read as mitmproxy's loop reads."""
    body = b"x" * (1024 * 1024)
    ours, theirs = socket.socketpair()

    async def run() -> list[int]:
        reader, writer = await asyncio.open_connection(sock=ours)
        handler = _Handler()
        handler.transports[conn] = server.ConnectionIO(handler=None, reader=reader, writer=writer)
        sizes: list[int] = []

        async def loop(self: Any, connection: Any) -> None:
            await asyncio.sleep(0.2)  # the transport fills the reader's buffer (it pauses past 128 KiB)
            r = self.transports[connection].reader
            while data := await r.read(65535):
                sizes.append(len(data))

        theirs.setblocking(False)
        task = asyncio.create_task(reads._reading(loop)(handler, conn))  # type: ignore[arg-type]
        await asyncio.get_running_loop().sock_sendall(theirs, body)
        theirs.close()
        await asyncio.wait_for(task, 10)
        writer.close()
        return sizes

    sizes = asyncio.run(run())
    assert sum(sizes) == len(body)
    return sizes


def test_an_upstream_read_takes_everything_buffered_up_to_256_kib() -> None:
    """What asyncio has already received comes in one event, not in 64 KiB slices."""
    sizes = _sizes_read(_server())
    assert max(sizes) > 65535  # mitmproxy's own size would cap every read there
    assert max(sizes) <= reads.READ_SIZE


def test_a_client_connection_keeps_mitmproxy_s_64_kib_reads() -> None:
    """Request-body bounds are counted per read (addons/substitute.py): left as they were."""
    assert max(_sizes_read(_client())) == 65535


def test_a_small_piece_is_read_when_it_arrives_not_when_more_comes() -> None:
    """An SSE event (a few bytes) is its own read, at once: a read never waits to fill up."""
    events = [b"data: %d\n\n" % i for i in range(5)]
    got = asyncio.run(_reads_as_mitmproxy_does(events, 0.1))
    assert [n for n, _ in got] == [len(e) for e in events]
    gaps = [b - a for (_, a), (_, b) in zip(got, got[1:], strict=False)]
    assert all(g > 0.05 for g in gaps)  # each came with its own send, 100 ms apart


def test_any_other_size_is_read_as_asked() -> None:
    async def run() -> bytes:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        theirs.sendall(b"y" * 5000)
        await asyncio.sleep(0.05)
        first = await reads.larger(reader)(100)
        theirs.close()
        writer.close()
        await writer.wait_closed()
        return first

    assert asyncio.run(run()) == b"y" * 100


def test_mitmproxy_still_reads_65535_per_event_and_the_patch_is_idempotent() -> None:
    """If mitmproxy changes its read, this module no longer applies: the test says so."""
    reads.larger_reads()
    handle = server.ConnectionHandler.handle_connection
    reads.larger_reads()
    assert server.ConnectionHandler.handle_connection is handle
    assert getattr(handle, reads._WRAPPED)
    original = inspect.unwrap(handle)
    assert f"reader.read({reads.MITMPROXY_READ})" in inspect.getsource(original)
