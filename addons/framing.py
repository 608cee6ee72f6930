"""framing: the body bytes sent upstream always match the length the request head declared.

An HTTP/1 upstream reads a request body by its ``Content-Length`` or its chunked framing (RFC
9112 §6.3); any byte past the declared length is read as the start of the next request on that
connection, and a body shorter than declared swallows the next request's bytes (request
smuggling). mitmproxy 12.3 writes whatever bytes a stream callable returns under whatever head
the request has, so two paths desynchronised an upstream connection:

- a body whose bytes were changed (re-encoded, swapped) while the client's ``Content-Length``
  stayed in the head (issue 20: a compressed body checked for a refusing credential);
- an HTTP/2 request whose head declared no length (HTTP/2 ends a body with END_STREAM, RFC 9113
  §8.1) sent to an HTTP/1 upstream: mitmproxy writes the head without ``Content-Length`` or
  ``Transfer-Encoding`` (so, to HTTP/1, a request without a body) and then the body's bytes,
  which the upstream reads as the next request, one the policy never saw.

:func:`install` wraps the two upstream-side senders of mitmproxy's protocol layer once per
process, so this holds for every flow whatever the addons did:

- toward an HTTP/1 upstream (``Http1Client.send``), an HTTP/2 request head without a length is
  held until its body starts: with a body it is sent ``Transfer-Encoding: chunked`` (mitmproxy
  then frames each read as a chunk), without one it is sent as is. ``Content-Length`` beside
  chunked is dropped (RFC 9112 §6.2: a sender must not send both);
- toward an HTTP/1 upstream, a request sent chunked (its body changed length) goes as HTTP/1.1
  even when the client spoke HTTP/1.0: chunked is HTTP/1.1 framing, and a recipient treats it in
  an HTTP/1.0 message as faulty (RFC 9112 §6.1), reading the body by another length;
- toward any upstream, the body bytes are counted against a declared ``Content-Length``: a read
  that would go past it, or a body that ends short of it, is never completed: the upstream
  connection is closed (HTTP/1) or the stream reset (HTTP/2), so the upstream never holds a
  whole request, and the sandbox gets a 502 (``framing`` in the error).

This reaches into mitmproxy's protocol layer (the dependency is pinned below 12.4);
tests/e2e/test_request_framing.py fails if the wrapped methods stop doing this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    HttpEvent,
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    RequestProtocolError,
    ResponseProtocolError,
)

log = logging.getLogger("surrogate")

_MARK = "_surrogate_framing"
_STATE = "_surrogate_framing_body"

Send = Callable[[Any, Any], Generator[Any, Any, None]]


@dataclass
class _Body:
    """One request body on its way to an upstream."""

    declared: int | None  # Content-Length; None: chunked, or framed by the protocol (HTTP/2)
    sent: int = 0
    held: RequestHeaders | None = None  # an HTTP/2 head without a length, waiting for its body
    broken: bool = False


def _chunked(req: http.Request) -> bool:
    return "chunked" in req.headers.get("transfer-encoding", "").lower()


def _unframed(req: http.Request) -> bool:
    """An HTTP/2 or HTTP/3 request whose head declares no length (END_STREAM frames its body)."""
    return (req.is_http2 or req.is_http3) and "content-length" not in req.headers


def _declared(req: http.Request, http1_upstream: bool) -> int | None | str:
    """The length the head declares: an int, None when the framing carries it, or a reason
    string when the head declares nothing usable."""
    length = req.headers.get("content-length")
    if length is None:
        # HTTP/1 without Content-Length or chunked: no body (RFC 9112 §6.3); HTTP/2: END_STREAM
        return 0 if http1_upstream else None
    if not (length.isascii() and length.isdigit()):
        return "its Content-Length is not a number"
    return int(length)


def _violation(body: _Body, more: int) -> str | None:
    if body.declared is None:
        return None
    if body.sent + more > body.declared:
        return f"request body runs past its Content-Length of {body.declared} bytes"
    return None


BROKEN = "surrogate refused to send a request whose body disagrees with its framing"  # addons/errorpage.py


def _why_broken(what: str) -> str:
    log.error("request body framing: %s; upstream connection closed", what)
    return f"{BROKEN}: {what}"


def _h1_send(original: Send) -> Send:
    def send(self: Any, event: HttpEvent) -> Generator[Any, Any, None]:
        if self.state == self.passthrough:  # after a 101 (WebSocket): raw bytes, no HTTP framing
            yield from original(self, event)
            return
        body: _Body | None = getattr(self, _STATE, None)
        if isinstance(event, RequestHeaders):
            req = event.request
            if _chunked(req) and req.http_version == "HTTP/1.0":
                # chunked is HTTP/1.1 framing (RFC 9112 §6.1: a recipient treats it in an HTTP/1.0
                # message as faulty framing); a proxy sends its own version (RFC 9110 §2.5)
                req = req.copy()
                req.http_version = "HTTP/1.1"
                event = RequestHeaders(event.stream_id, req, event.end_stream, event.replay_flow)
            if _chunked(req):
                req.headers.pop("content-length", None)
            elif _unframed(req) and not event.end_stream:
                setattr(self, _STATE, _Body(None, held=event))
                return
            declared = _declared(req, True)
            if isinstance(declared, str):
                yield from _h1_break(self, event.stream_id, declared)
                return
            setattr(self, _STATE, _Body(None if _chunked(req) else declared))
            yield from original(self, event)
            return
        if body is None or not isinstance(event, (RequestData, RequestEndOfMessage)):
            yield from original(self, event)
            return
        if body.broken:
            return
        if body.held is not None:
            head, body.held = body.held, None
            if isinstance(event, RequestData):  # a body after all: chunked (RFC 9112 §7.1)
                head.request.headers["transfer-encoding"] = "chunked"
            else:
                body.declared = 0
            yield from original(self, head)
        if isinstance(event, RequestData):
            if (why := _violation(body, len(event.data))) is not None:
                yield from _h1_break(self, event.stream_id, why)
                return
            body.sent += len(event.data)
        elif body.declared is not None and body.sent != body.declared:
            why = f"request body ended after {body.sent} of its Content-Length of {body.declared} bytes"
            yield from _h1_break(self, event.stream_id, why)
            return
        yield from original(self, event)

    setattr(send, _MARK, True)
    return send


def _h1_break(self: Any, stream_id: int, what: str) -> Generator[Any, Any, None]:
    setattr(self, _STATE, _Body(None, broken=True))
    self.state = self.done  # nothing more is read or written on this connection
    yield commands.CloseConnection(self.conn)
    yield ReceiveHttp(ResponseProtocolError(stream_id, _why_broken(what), ErrorCode.GENERIC_SERVER_ERROR))


def _h2_handle(original: Send) -> Send:
    def _handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
        if not isinstance(event, (RequestHeaders, RequestData, RequestEndOfMessage)):
            if isinstance(event, RequestProtocolError):
                self.__dict__.get(_STATE, {}).pop(event.stream_id, None)
            yield from original(self, event)
            return
        bodies: dict[int, _Body] = self.__dict__.setdefault(_STATE, {})
        sid = event.stream_id  # the client side's id: the original maps it to its own in place
        if isinstance(event, RequestHeaders):
            declared = _declared(event.request, False)
            if isinstance(declared, str):
                bodies[sid] = _Body(None, broken=True)
                yield ReceiveHttp(
                    ResponseProtocolError(sid, _why_broken(declared), ErrorCode.GENERIC_SERVER_ERROR)
                )
                return
            bodies[sid] = _Body(declared)
            yield from original(self, event)
            return
        body = bodies.get(sid)
        if body is None or getattr(event, _MARK, False):  # resumed from the stream queue: counted
            yield from original(self, event)
            return
        setattr(event, _MARK, True)
        if body.broken:
            return
        why = None
        if isinstance(event, RequestData):
            why = _violation(body, len(event.data))
            body.sent += len(event.data)
        else:
            bodies.pop(sid, None)
            if body.declared is not None and body.sent != body.declared:
                why = f"request body ended after {body.sent} of its Content-Length of {body.declared} bytes"
        if why is None:
            yield from original(self, event)
            return
        body.broken = True
        bodies[sid] = body
        message = _why_broken(why)
        yield from original(self, RequestProtocolError(sid, message, ErrorCode.GENERIC_CLIENT_ERROR))
        yield ReceiveHttp(ResponseProtocolError(sid, message, ErrorCode.GENERIC_SERVER_ERROR))

    setattr(_handle_event, _MARK, True)
    return _handle_event


def install() -> None:
    """Wrap mitmproxy's upstream-side request senders (once per process; later calls do nothing)."""
    h1: Any = _http1.Http1Client
    if not getattr(h1.send, _MARK, False):
        h1.send = _h1_send(h1.send)
    h2: Any = _http2.Http2Client
    if not getattr(h2._handle_event, _MARK, False):
        h2._handle_event = _h2_handle(h2._handle_event)
