"""holdio: a held request's client connection is not read while it waits (review r-approve).

mitmproxy reads every client socket in a loop and, while a hook is pending, queues what it read
in memory (``Layer._paused_event_queue``): nothing back-pressures the client. A request held in
``requestheaders`` for an operator (:mod:`addons.approve`) therefore had its whole body read
into the proxy's memory while it waited: a 400 MB upload over HTTP/2 grew the process by 470 MB,
measured, and a claim may hold many. So while a request with a body is held, the client's TCP
transport stops reading (``pause_reading``): the body stays in the socket buffers and TCP flow
control stops the client; reading resumes once the request is decided.

- Decided: HTTP/1 carries one request at a time, so nothing else waits. On HTTP/2 the whole
  connection waits (its other streams too) until the decision: TCP cannot back-pressure one
  stream, and mitmproxy acknowledges DATA at once, so the stream's own window cannot either. A
  request without a body (HTTP/1: no ``Transfer-Encoding`` and no ``Content-Length`` but 0;
  HTTP/2: ``Content-Length: 0``, see :func:`has_body`) is held without pausing anything.
- A paused transport sees no EOF, so a client that went away is found from the socket's TCP
  state (``TCP_INFO``: anything but ESTABLISHED, e.g. CLOSE_WAIT after the peer's FIN; Linux).
- asyncio's StreamReader pauses the transport itself when its buffer fills and resumes it once
  the buffer drains (``_maybe_resume_transport``), which undid a plain ``pause_reading`` (a held
  upload was read whole, seen in the test): while held, the transport's ``resume_reading`` is
  shadowed by a no-op on the instance, and restored at the release.

mitmproxy 12.3 internals: proxyserver's handlers by client id, their ``ConnectionIO`` writers
(as :func:`addons.scrub._close_client` and :mod:`addons.fence`). Where there is no TCP socket
transport (another mode), nothing is paused and nothing is known: the hold works as before.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from mitmproxy import ctx, http

_ESTABLISHED = 1  # tcpi_state (linux/include/net/tcp_states.h)
_paused: dict[str, int] = {}  # client id -> held requests that paused it (HTTP/2: several)


def _transport(flow: http.HTTPFlow) -> Any:
    server = ctx.master.addons.get("proxyserver")
    handler = getattr(server, "connections", {}).get(flow.client_conn.id)
    io = getattr(handler, "transports", {}).get(flow.client_conn)
    transport = getattr(getattr(io, "writer", None), "transport", None)
    return transport if hasattr(transport, "pause_reading") else None


def has_body(flow: http.HTTPFlow) -> bool:
    """Whether a body may follow the request head. HTTP/1 (RFC 9112 §6.3): a
    ``Transfer-Encoding``, or a ``Content-Length`` other than 0. HTTP/2: anything but
    ``Content-Length: 0`` (mitmproxy does not tell the hook whether the HEADERS frame ended the
    stream, and DATA may follow without a length: fail closed)."""
    headers = flow.request.headers
    h1 = not (flow.request.is_http2 or flow.request.is_http3)
    if h1 and "transfer-encoding" in headers:
        return True
    length = headers.get("content-length", "0" if h1 else "").strip()
    return not (length.isdigit() and int(length) == 0)


class Hold:
    """The client connection of one held request, not read while it is held."""

    def __init__(self, flow: http.HTTPFlow) -> None:
        """Never raises: without a transport to pause the hold works as before."""
        self.flow = flow
        self.id = flow.client_conn.id
        try:
            self.transport = _transport(flow) if has_body(flow) else None
            if self.transport is not None:
                if "resume_reading" not in vars(self.transport):
                    self.transport.resume_reading = _held_back  # nobody resumes it while held
                _paused[self.id] = _paused.get(self.id, 0) + 1
                self.keep()
        except Exception:  # noqa: BLE001 - mitmproxy or asyncio internals changed: hold without pausing
            self.transport = None

    def keep(self) -> None:
        """Pause reading (again, should anything have resumed it)."""
        t = self.transport
        if t is not None and not t.is_closing() and t.is_reading():
            t.pause_reading()

    def gone(self) -> bool:
        """Whether the client went away (its connection closed, or its peer sent FIN)."""
        if self.flow.client_conn.timestamp_end is not None:
            return True
        t = self.transport or _transport(self.flow)
        if t is None:
            return False
        if t.is_closing():
            return True
        sock = t.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        except OSError:
            return True
        return bool(struct.unpack_from("B", info)[0] != _ESTABLISHED)

    def release(self) -> None:
        """Read again, once no other held request of this connection keeps it paused."""
        if self.transport is None:
            return
        left = _paused.get(self.id, 1) - 1
        if left > 0:
            _paused[self.id] = left
        else:
            _paused.pop(self.id, None)
            vars(self.transport).pop("resume_reading", None)  # asyncio's own again
            if not self.transport.is_closing():
                self.transport.resume_reading()
        self.transport = None


def _held_back() -> None:
    """A held connection's ``resume_reading``: it stays paused until its release."""
