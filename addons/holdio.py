"""holdio: while an HTTP/1 request is held unread, its client connection is not read (issue 16).

mitmproxy keeps reading a client connection while a hook awaits, and queues what it reads in the
paused layer: a request held at its head would have its whole body read into memory while an
operator decides. For a held HTTP/1 request whose body is not read (longer than the preview
bound, or chunked), :class:`Unread` pauses reading the client's socket (asyncio's
``pause_reading``; nothing else can arrive on an HTTP/1 connection while its request is
unanswered), so the kernel's buffers fill and the client's send blocks: back-pressure, flat
memory. Reading resumes when the hold ends, whatever the decision.

A paused socket's end of file is never read, so whether the client went away is asked of the
socket itself: ``poll`` for ``POLLRDHUP`` (Linux: the peer shut its writing side, even with data
still unread), ``POLLHUP`` or ``POLLERR``. A client that half-closes while its request is held is
taken for gone (its request withdrawn): it cannot have sent the whole body it declared, since it
is not being read.

HTTP/2 is not paused: one connection carries the claim's other streams, which a held request
must not block (mitmproxy acknowledges each DATA frame as it reads it, so a held HTTP/2 stream's
body is queued in memory: a documented limit, rules/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from typing import Any

from mitmproxy import ctx, http

_GONE = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


def _streams(flow: http.HTTPFlow) -> tuple[asyncio.Transport | None, Any]:
    server: Any = ctx.master.addons.get("proxyserver")
    handler = server.connections.get(flow.client_conn.id) if server is not None else None
    io = handler.transports.get(flow.client_conn) if handler is not None else None
    transport = getattr(getattr(io, "writer", None), "transport", None)
    ok = isinstance(transport, asyncio.Transport)
    return (transport if ok else None), getattr(io, "reader", None)


class Unread:
    """The client connection of a held HTTP/1 request, not read while held."""

    def __init__(self, flow: http.HTTPFlow) -> None:
        self.transport, self.reader = _streams(flow)
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        self.poll: select.poll | None = None
        if sock is not None:
            self.poll = select.poll()
            self.poll.register(sock.fileno(), _GONE)
        self.pause()

    def pause(self) -> None:
        """Stop reading (again: asyncio's stream reader resumes a transport it paused itself)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            # asyncio's StreamReader resumes a transport it paused (its buffer full) as soon as
            # mitmproxy reads on: from now on, the pause is ours (released in `release`)
            if isinstance(self.reader, asyncio.StreamReader) and getattr(self.reader, "_paused", False):
                self.reader._paused = False  # type: ignore[attr-defined]

    def gone(self) -> bool:
        """The client shut its side or the socket failed."""
        if self.poll is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return any(ev & _GONE for _, ev in self.poll.poll(0))
        return True

    def release(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()
