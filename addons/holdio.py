"""holdio: an HTTP/1 request's body is not read while its head's hooks decide (issue 16).

mitmproxy keeps reading a client connection while a hook awaits, and queues what it reads in the
paused layer: a request held at its head would have its whole body read into memory while an
operator decides. Two parts keep the body in the client's kernel buffers instead (asyncio's
``pause_reading``; nothing else can arrive on an HTTP/1 connection while its request is
unanswered), so the client's send blocks: back-pressure, flat memory.

- :func:`install` wraps mitmproxy's ``ConnectionHandler.hook_task`` once per process: where the
  ``requestheaders`` hook of an HTTP/1 request that declares a body (``Content-Length`` above 0,
  or ``Transfer-Encoding``) is started, synchronously as its head is parsed (a hook runs as a
  task of its own, later, while the connection's read loop goes on: a client that sends its body
  with its head would have it read before the hook even began), reading that client connection
  pauses, and resumes when the hook is done. An ordinary request pays two ``epoll_ctl`` calls; a
  request without a body, none.
- :class:`Unread`, for a held request, keeps the pause for as long as it is held (asyncio's
  stream reader resumes a transport it paused itself) and tells whether the client went away.

A paused socket's end of file is never read, so whether the client went away is asked of the
socket itself: ``poll`` for ``POLLRDHUP`` (Linux: the peer shut its writing side, even with data
still unread), ``POLLHUP`` or ``POLLERR``. A client that half-closes while its request is held is
taken for gone (its request withdrawn): it cannot have sent the whole body it declared, since it
is not being read.

HTTP/2: a held request that may carry a body (:func:`has_body`) pauses its whole connection
until its decision (review r-approve): mitmproxy acknowledges each DATA frame as it reads it, so
neither TCP nor the stream's own window could hold one stream's body back, and a held 96 MiB
upload grew the proxy by 112 MiB. The connection's other streams wait meanwhile; other
connections, the claim's and others', do not. The head-time pause (:func:`install`) is HTTP/1
only: an HTTP/2 connection's reading must go on for its other streams' heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import weakref
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.proxy import commands, server

_GONE = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR
_MARK = "_surrogate_holdio"
_SETUP = frozenset({"next_layer", "tls_established_client"})
_holds: weakref.WeakKeyDictionary[asyncio.Transport, int] = weakref.WeakKeyDictionary()


def install() -> None:
    """Pause reading an HTTP/1 client while its request's ``requestheaders`` hook runs, when the
    request declares a body (module docstring). Idempotent."""
    original = server.ConnectionHandler.hook_task
    if getattr(original, _MARK, False):
        return

    def hook_task(self: server.ConnectionHandler, hook: commands.StartHook) -> Any:
        task = original(self, hook)
        if hook.name in _SETUP:
            # what the client sends before its first request head is parsed (the body after
            # it, too) waits while the connection's next layer is chosen; not an HTTP/2 one
            if self.client.alpn == b"h2":
                return task
        else:
            flow = getattr(hook, "flow", None) if hook.name == "requestheaders" else None
            if not isinstance(flow, http.HTTPFlow) or not _declares_body(flow.request):
                return task
        io = self.transports.get(self.client)
        transport = getattr(getattr(io, "writer", None), "transport", None)
        if not isinstance(transport, asyncio.Transport) or transport.is_closing():
            return task
        hold(transport, getattr(io, "reader", None))
        return _then_release(task, transport)

    setattr(hook_task, _MARK, True)
    server.ConnectionHandler.hook_task = hook_task  # type: ignore[method-assign]


def has_body(flow: http.HTTPFlow) -> bool:
    """Whether a body may follow the request head, so a held request pauses its connection.
    HTTP/1 (RFC 9112 §6.3): a ``Transfer-Encoding``, or a ``Content-Length`` other than 0.
    HTTP/2: anything but ``Content-Length: 0`` (mitmproxy does not tell the hook whether the
    HEADERS frame ended the stream, and DATA may follow without a length: fail closed)."""
    headers = flow.request.headers
    h1 = not (flow.request.is_http2 or flow.request.is_http3)
    if h1 and "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0" if h1 else "").strip()
    return not (length.isdigit() and int(length) == 0)


def _declares_body(req: http.Request) -> bool:
    if not req.http_version.startswith("HTTP/1"):
        return False
    length = req.headers.get("content-length")
    return "transfer-encoding" in req.headers or (length is not None and length.strip() not in ("", "0"))


async def _then_release(task: Any, transport: asyncio.Transport) -> None:
    try:
        await task
    finally:
        release(transport)


def hold(transport: asyncio.Transport, reader: Any) -> None:
    """Stop reading ``transport`` until as many :func:`release` calls as holds: the pauses nest
    (a request head parsed while the connection's next layer was being chosen)."""
    _holds[transport] = _holds.get(transport, 0) + 1
    _pause(transport, reader)


def release(transport: asyncio.Transport) -> None:
    left = _holds.get(transport, 1) - 1
    if left > 0:
        _holds[transport] = left
        return
    _holds.pop(transport, None)
    if not transport.is_closing():
        with contextlib.suppress(RuntimeError):
            transport.resume_reading()


def _pause(transport: asyncio.Transport, reader: Any) -> None:
    if transport.is_closing():
        return
    transport.pause_reading()
    # asyncio's StreamReader resumes a transport it paused (its buffer full) as soon as mitmproxy
    # reads on: from now on, the pause is ours (ended by resume_reading)
    if isinstance(reader, asyncio.StreamReader) and getattr(reader, "_paused", False):
        reader._paused = False  # type: ignore[attr-defined]


def _streams(flow: http.HTTPFlow) -> tuple[asyncio.Transport | None, Any]:
    server: Any = ctx.master.addons.get("proxyserver")
    handler = server.connections.get(flow.client_conn.id) if server is not None else None
    io = handler.transports.get(flow.client_conn) if handler is not None else None
    transport = getattr(getattr(io, "writer", None), "transport", None)
    ok = isinstance(transport, asyncio.Transport)
    return (transport if ok else None), getattr(io, "reader", None)


class Unread:
    """The client connection of a held request, not read while held: every HTTP/1 one, and an
    HTTP/2 one that may carry a body (its whole connection; see the module docstring)."""

    def __init__(self, flow: http.HTTPFlow) -> None:
        self.transport, self.reader = _streams(flow)
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        self.poll: select.poll | None = None
        if sock is not None:
            self.poll = select.poll()
            self.poll.register(sock.fileno(), _GONE)
        if self.transport is not None:
            hold(self.transport, self.reader)

    def pause(self) -> None:
        """Stop reading again (asyncio's stream reader resumes a transport it paused itself)."""
        if self.transport is not None:
            _pause(self.transport, self.reader)

    def gone(self) -> bool:
        """The client shut its side or the socket failed."""
        if self.poll is None:
            return False
        with contextlib.suppress(OSError, ValueError):
            return any(ev & _GONE for _, ev in self.poll.poll(0))
        return True

    def release(self) -> None:
        if self.transport is not None:
            release(self.transport)
            self.transport = None
