"""Read what an upstream connection has, up to 256 KiB per event rather than 64 KiB (issue 19).

mitmproxy 12.3 (``mitmproxy.proxy.server.ConnectionHandler.handle_connection``) reads each
connection with ``reader.read(65535)`` and hands every read to the protocol layers as one
``DataReceived`` event: a 50 MB download is about 800 events, each through the layer stack
(TLS, HTTP/1 or HTTP/2, our stream and scrub callables, about 30 layer calls per event, measured
with bench/cprof.py). asyncio's transport already receives up to 256 KiB per ``recv()``, so under
a fast upstream the reader's buffer holds more than 64 KiB, and the rest waits for the next turn
of the loop. :func:`larger_reads` makes that loop's ``read(65535)`` a ``read(READ_SIZE)`` on
connections to upstreams: fewer, larger events per megabyte of a response, the same bytes in the
same order.

Connections from clients keep mitmproxy's 64 KiB: what a request body's checks hold and bound
is counted per read (a coded body whose tail may still become a placeholder is refused once
more than 1 MiB is held, addons/substitute.py; tests/e2e/test_request_framing.py), and a
client's uploads are not what issue 19 measures.

Nothing waits for more: ``StreamReader.read(n)`` returns at once with whatever is buffered (at
least one byte), so an SSE event still goes out in the read that brings it (invariant 5;
tests/unit/engine/test_reads.py, and the SSE tests of tests/e2e). How much is held stays what
it was: the reader pauses the transport past twice its limit (64 KiB), whatever ``n`` is asked
for; one event holds at most ``READ_SIZE`` bytes (and the TLS layer's plaintext of it).

Only that one call is changed: other callers of the same reader (none in mitmproxy 12.3) get
what they ask for. Idempotent.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from mitmproxy.connection import Connection, Server
from mitmproxy.proxy import server

READ_SIZE = 256 * 1024  # asyncio's selector transports recv() up to 256 KiB (max_size)
MITMPROXY_READ = 65535  # what handle_connection asks for
_WRAPPED = "_surrogate_larger_reads"

Handler = Callable[[server.ConnectionHandler, Connection], Coroutine[Any, Any, None]]


def larger(reader: asyncio.StreamReader, size: int = READ_SIZE) -> Callable[[int], Awaitable[bytes]]:
    """``reader.read`` with mitmproxy's 65535 read as ``size``; any other ``n`` as asked."""
    read = reader.read

    def read_more(n: int = -1) -> Awaitable[bytes]:
        return read(size if n == MITMPROXY_READ else n)

    return read_more


def larger_reads() -> None:
    """Patch ``ConnectionHandler.handle_connection`` (see the module docstring). Idempotent."""
    original: Handler = server.ConnectionHandler.handle_connection
    if getattr(original, _WRAPPED, False):
        return
    server.ConnectionHandler.handle_connection = _reading(original)  # type: ignore[method-assign,assignment]


def _reading(original: Handler) -> Handler:
    @functools.wraps(original)
    async def handle_connection(self: server.ConnectionHandler, connection: Connection) -> None:
        io = self.transports.get(connection)
        reader = io.reader if io is not None else None
        upstream = isinstance(connection, Server)
        if upstream and isinstance(reader, asyncio.StreamReader) and "read" not in vars(reader):
            reader.read = larger(reader)  # type: ignore[method-assign,assignment]
        await original(self, connection)

    setattr(handle_connection, _WRAPPED, True)
    return handle_connection
