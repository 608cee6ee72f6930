"""Close a connection whose handler is cancelled while it waits to hand its data to the layers.

mitmproxy 12.3 (``mitmproxy.proxy.server.ConnectionHandler.handle_connection``) reads a
connection in a loop and passes each read to the protocol layers with ``await
self.server_event(...)``, which first takes a lock held by whichever task is handling an event.
When another task, handling a hook's answer under that lock, closes the connection (a refused
request whose body may be large is answered by closing it: :func:`addons.facts.refuse`), it
cancels the reading task. If that task is waiting for the lock at that moment, the cancellation
leaves ``handle_connection`` from its unguarded ``await``: the transport is never popped and its
socket never closed. The client waited for an answer that never came until its own timeout
(seen: ``tests/e2e/test_hmac.py``, a chunked body toward an HMAC-signing host, about once in 40
runs on a loaded machine; the proxy side of the socket stayed ESTABLISHED).

:func:`close_on_cancel` wraps ``handle_connection`` so that a cancellation that escapes it closes
what the loop would have closed: the connection's state is set to closed, its transport popped
and its writer closed (buffered bytes are still flushed by asyncio), then the cancellation is
re-raised as before. A connection that ends any other way is untouched. Idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from mitmproxy.connection import Connection, ConnectionState
from mitmproxy.proxy import server

_WRAPPED = "_surrogate_closes_on_cancel"

Handler = Callable[[server.ConnectionHandler, Connection], Coroutine[Any, Any, None]]


def close_on_cancel() -> None:
    """Patch ``ConnectionHandler.handle_connection`` (see the module docstring). Idempotent."""
    original: Handler = server.ConnectionHandler.handle_connection
    if getattr(original, _WRAPPED, False):
        return
    server.ConnectionHandler.handle_connection = _closing(original)  # type: ignore[method-assign,assignment]


def _closing(original: Handler) -> Handler:
    @functools.wraps(original)
    async def handle_connection(self: server.ConnectionHandler, connection: Connection) -> None:
        try:
            await original(self, connection)
        except asyncio.CancelledError:
            io = self.transports.pop(connection, None)
            if io is not None:  # the loop ended without its own clean-up: do it
                connection.state = ConnectionState.CLOSED
                if io.writer is not None:
                    with contextlib.suppress(OSError):
                        io.writer.close()
            raise

    setattr(handle_connection, _WRAPPED, True)
    return handle_connection
