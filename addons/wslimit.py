"""wslimit: a bound on one WebSocket message, in both directions (issue 20).

mitmproxy 12.3 assembles a whole WebSocket message (every frame up to FIN, decompressed) before
any hook runs (``WebsocketLayer.relay_messages`` in ``mitmproxy/proxy/layers/websocket.py``
keeps the fragments in ``frame_buf``), with no limit, and forwards nothing of it before it ends:
a message that never ends (frames without FIN) grew the proxy 1:1. It cannot be streamed here
instead: a message from the upstream must be whole to be scrubbed (DESIGN.md invariant 9).

So a message past the pool's ``limits.websocket_message_bytes`` (default 16 MiB,
:data:`proxy.core.limits.DEFAULT_WEBSOCKET_MESSAGE`) ends the WebSocket: both sides get a Close frame
with code 1009 (Message Too Big, RFC 6455 §7.4.1) and both connections are closed; nothing of
the message is forwarded. It is counted in ``surrogate_limit_refusals_total{limit=
"websocket_message"}`` and logged (a warning on stderr). Checked three ways, whichever comes
first:

- after each read, the bytes held for an unfinished message (and its fragment count, at most
  :data:`MAX_FRAGMENTS`: a stream of empty non-FIN frames holds no bytes but grows a list);
- a message that completes within one read is checked in the ``websocket_message`` hook, before
  any other addon (scrub) sees it, and dropped;
- a permessage-deflate message (RFC 7692) is inflated at most to the limit: mitmproxy's
  ``PerMessageDeflate`` inflates each frame without a bound (a 64 KiB read of zeros inflates to
  64 MiB), so :func:`install` caps the inflation per message.

The bound on one message does not bound the process: a claim may open hundreds of WebSockets,
each holding an unfinished message just under it (measured in the r2 review: 12 connections of
15 MiB grew the proxy by 188 MiB; the default connection limit allows 256, in both directions).
So the bytes held in unfinished messages by all WebSockets of one process together are bounded
too (``--websocket-held-bytes``, option ``surrogate_websocket_held_bytes``, default
:data:`DEFAULT_HELD`, 256 MiB): the WebSocket whose read takes the total past it is ended the same
way (1009), counted as ``limit="websocket_held"``. It is a bound per worker process (with
``--workers N`` the node holds at most N times it): the held bytes are the process's own memory.

:func:`install` wraps mitmproxy's and wsproto's methods once per process (the dependency is
pinned below mitmproxy 12.4); tests/e2e/test_websocket_limits.py fails if they stop bounding.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
import zlib
from collections.abc import Callable, Generator
from typing import Any

import wsproto.events
from mitmproxy import addonmanager, ctx, exceptions, http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import websocket
from wsproto.connection import ConnectionState
from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import CloseReason

from addons import facts
from proxy.core.limits import DEFAULT_WEBSOCKET_HELD, DEFAULT_WEBSOCKET_MESSAGE, Limits
from proxy.engine.state import State

log = logging.getLogger("surrogate")

LIMIT = "surrogate.websocket_limit"  # int: the flow's message bound, set at websocket_start
TOO_BIG = "surrogate.websocket_too_big"  # "client" | "server": whose message ended it
HELD_TOO_MUCH = "surrogate.websocket_held"  # set when the process's held bytes ended it
DEFAULT_HELD = DEFAULT_WEBSOCKET_HELD
MAX_FRAGMENTS = 65536  # frames of one unfinished message
TOO_BIG_CODE = 1009  # RFC 6455 §7.4.1
CLOSE_GRACE = 1.0  # seconds the Close frame has to reach both peers before the connections close

_MARK = "_surrogate_wslimit"
_INFLATE_LIMIT = "_surrogate_inflate_limit"
_INFLATED = "_surrogate_inflated"
_INFLATE_OVER = "_surrogate_inflate_over"
_INFLATE_REPORT = "_surrogate_inflate_report"  # (flow.metadata, "client" | "server")

Method = Callable[..., Any]

# Bytes each WebSocket layer of this process holds in unfinished messages (both directions), and
# the bound on their sum (the option, set in configure). Weak: a layer that ends by any path is
# forgotten with it.
_held: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_held_bound = [DEFAULT_HELD]


class WebSocketLimit:
    """Per-flow glue: the pool's bound on the flow at its start, the metric at its end, and the
    check of a message that completed within one read."""

    def __init__(self, state: State) -> None:
        self.state = state

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            "surrogate_websocket_held_bytes",
            int,
            DEFAULT_HELD,
            "Bytes held in unfinished WebSocket messages by this process, all WebSockets together.",
        )

    def configure(self, updated: set[str]) -> None:
        if "surrogate_websocket_held_bytes" in updated:
            bound = ctx.options.surrogate_websocket_held_bytes
            if bound < 1024:
                raise exceptions.OptionsError(f"surrogate_websocket_held_bytes {bound} must be at least 1024")
            _held_bound[0] = bound

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        pool = self.state.policy.pools.get(claim.pool) if claim is not None else None
        flow.metadata[LIMIT] = (pool.limits if pool is not None else Limits()).websocket_message

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        assert flow.websocket is not None
        message = flow.websocket.messages[-1]
        if TOO_BIG in flow.metadata:
            message.drop()  # the WebSocket is being closed: nothing more goes through
        elif len(message.content) > flow.metadata.get(LIMIT, DEFAULT_WEBSOCKET_MESSAGE):
            flow.metadata[TOO_BIG] = "client" if message.from_client else "server"
            message.drop()

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        if TOO_BIG in flow.metadata:
            limit = "websocket_held" if HELD_TOO_MUCH in flow.metadata else "websocket_message"
            self.state.metrics.limit_refusals.labels(limit).inc()


def _held_by(ws: websocket.WebsocketConnection) -> tuple[int, int]:
    return sum(map(len, ws.frame_buf)), len(ws.frame_buf)


def _close(layer: Any, limit: int) -> Generator[Any, Any, None]:
    flow: http.HTTPFlow = layer.flow
    who = flow.metadata[TOO_BIG]
    _held.pop(layer, None)
    if HELD_TOO_MUCH in flow.metadata:
        limit = _held_bound[0]
        reason = f"unfinished messages on this proxy past {limit} bytes"
        what = "WebSockets of this process hold more than %d bytes of unfinished messages"
    else:
        reason = f"message larger than {limit} bytes"
        what = "message larger than %d bytes"
    log.warning(
        "request %s: WebSocket message from the %s: " + what + "; closed with 1009",
        flow.metadata.get(facts.REQUEST_ID, flow.id),
        who,
        limit,
    )
    for ws in (layer.server_ws, layer.client_ws):
        ws.frame_buf = [b""]  # let go of what was held
        if ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            yield ws.send2(wsproto.events.CloseConnection(code=TOO_BIG_CODE, reason=reason))
    assert flow.websocket is not None
    flow.websocket.timestamp_end = time.time()
    flow.websocket.closed_by_client = False
    flow.websocket.close_code = TOO_BIG_CODE
    flow.websocket.close_reason = reason
    # Closing a socket with unread bytes in it resets the connection, and the peer that is still
    # sending (the one whose message is too big) would lose the Close frame with it: read and
    # drop what comes for a moment, then close both (RFC 6455 §7.1.1: the server closes first).
    layer._handle_event = _draining(layer)
    yield commands.RequestWakeup(CLOSE_GRACE)
    yield websocket.WebsocketEndHook(flow)
    flow.live = False


def _draining(layer: Any) -> Callable[[events.Event], Generator[Any, Any, None]]:
    open_ = [layer.server_ws.conn, layer.client_ws.conn]

    def drain(event: events.Event) -> Generator[Any, Any, None]:
        if isinstance(event, events.ConnectionClosed) and event.connection in open_:
            open_.remove(event.connection)  # this peer answered (or went): close our side too
            yield commands.CloseConnection(event.connection)
        elif isinstance(event, events.Wakeup):
            for conn in open_:
                yield commands.CloseConnection(conn)
            open_.clear()
        if not open_:
            layer._handle_event = _closed
        # anything read meanwhile (the rest of the message, the peer's Close) is dropped unread

    return drain


def _closed(event: events.Event) -> Generator[Any, Any, None]:
    yield from ()  # a late wakeup or read after both connections were closed


def _bounded_relay(original: Method) -> Method:
    @functools.wraps(original)
    def relay_messages(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        limit: int = self.flow.metadata.get(LIMIT, DEFAULT_WEBSOCKET_MESSAGE)
        sides = ((self.client_ws, "client"), (self.server_ws, "server"))
        for ws, who in sides:
            for ext in ws._proto.extensions:
                setattr(ext, _INFLATE_LIMIT, limit)
                setattr(ext, _INFLATE_REPORT, (self.flow.metadata, who))
        yield from original(self, event)
        if self._handle_event != self.relay_messages:  # closed by a peer meanwhile
            _held.pop(self, None)
            return
        total = 0
        for ws, who in sides:
            size, fragments = _held_by(ws)
            total += size
            if size > limit or fragments > MAX_FRAGMENTS:
                self.flow.metadata.setdefault(TOO_BIG, who)
        if total:
            _held[self] = total
            if TOO_BIG not in self.flow.metadata and sum(_held.values()) > _held_bound[0]:
                self.flow.metadata[HELD_TOO_MUCH] = True
                bigger = _held_by(self.client_ws)[0] >= _held_by(self.server_ws)[0]
                self.flow.metadata[TOO_BIG] = "client" if bigger else "server"
        else:
            _held.pop(self, None)
        if TOO_BIG in self.flow.metadata:
            yield from _close(self, limit)

    setattr(relay_messages, _MARK, True)
    return relay_messages


def _bounded_inflate(original: Method) -> Method:
    @functools.wraps(original)
    def frame_inbound_payload_data(self: Any, proto: Any, data: bytes) -> bytes | CloseReason:
        limit = getattr(self, _INFLATE_LIMIT, None)
        if limit is None or not self._inbound_compressed or not self._inbound_is_compressible:
            result: bytes | CloseReason = original(self, proto, data)
            return result
        if getattr(self, _INFLATE_OVER, False):
            return b""  # past the limit: the relay closes the WebSocket after this read
        assert self._decompressor is not None
        inflated = getattr(self, _INFLATED, 0)
        try:
            out: bytes = self._decompressor.decompress(bytes(data), max(1, limit + 1 - inflated))
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        inflated += len(out)
        setattr(self, _INFLATED, inflated)
        if self._decompressor.unconsumed_tail or inflated > limit:
            setattr(self, _INFLATE_OVER, True)
            report: tuple[dict[str, Any], str] = getattr(self, _INFLATE_REPORT, ({}, ""))
            report[0].setdefault(TOO_BIG, report[1])
            return b""
        return out

    setattr(frame_inbound_payload_data, _MARK, True)
    return frame_inbound_payload_data


def _counted_complete(original: Method) -> Method:
    @functools.wraps(original)
    def frame_inbound_complete(self: Any, proto: Any, fin: bool) -> Any:
        if getattr(self, _INFLATE_OVER, False):
            return None  # the inflater is abandoned mid-stream: nothing more is decoded
        if fin:
            setattr(self, _INFLATED, 0)  # the next message starts from nothing
        return original(self, proto, fin)

    setattr(frame_inbound_complete, _MARK, True)
    return frame_inbound_complete


def install() -> None:
    """Wrap mitmproxy's WebSocket relay and wsproto's inflater (once per process)."""
    layer: Any = websocket.WebsocketLayer
    if not getattr(layer.relay_messages, _MARK, False):
        layer.relay_messages = _bounded_relay(layer.relay_messages)
    deflate: Any = PerMessageDeflate
    if not getattr(deflate.frame_inbound_payload_data, _MARK, False):
        deflate.frame_inbound_payload_data = _bounded_inflate(deflate.frame_inbound_payload_data)
        deflate.frame_inbound_complete = _counted_complete(deflate.frame_inbound_complete)
