"""wslimit: a bound on one WebSocket message, in both directions (issue 20).

mitmproxy 12.3 assembles a whole WebSocket message (every frame up to FIN, decompressed) before
any hook runs (``WebsocketLayer.relay_messages`` in ``mitmproxy/proxy/layers/websocket.py``
keeps the fragments in ``frame_buf``), with no limit, and forwards nothing of it before it ends:
a message that never ends (frames without FIN) grew the proxy 1:1. It cannot be streamed here
instead: a message from the upstream must be whole to be scrubbed (DESIGN.md invariant 9).

So a message past the pool's ``limits.websocket_message_bytes`` (default 16 MiB,
:data:`proxy.limits.DEFAULT_WEBSOCKET_MESSAGE`) ends the WebSocket: both sides get a Close frame
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

:func:`install` wraps mitmproxy's and wsproto's methods once per process (the dependency is
pinned below mitmproxy 12.4); tests/e2e/test_websocket_limits.py fails if they stop bounding.
"""

from __future__ import annotations

import functools
import logging
import time
import zlib
from collections.abc import Callable, Generator
from typing import Any

import wsproto.events
from mitmproxy import http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import websocket
from wsproto.connection import ConnectionState
from wsproto.extensions import PerMessageDeflate
from wsproto.frame_protocol import CloseReason

from addons import facts
from proxy.limits import DEFAULT_WEBSOCKET_MESSAGE, Limits
from proxy.state import State

log = logging.getLogger("surrogate")

LIMIT = "surrogate.websocket_limit"  # int: the flow's message bound, set at websocket_start
TOO_BIG = "surrogate.websocket_too_big"  # "client" | "server": whose message ended it
MAX_FRAGMENTS = 65536  # frames of one unfinished message
TOO_BIG_CODE = 1009  # RFC 6455 §7.4.1
CLOSE_GRACE = 1.0  # seconds the Close frame has to reach both peers before the connections close

_MARK = "_surrogate_wslimit"
_INFLATE_LIMIT = "_surrogate_inflate_limit"
_INFLATED = "_surrogate_inflated"
_INFLATE_OVER = "_surrogate_inflate_over"
_INFLATE_REPORT = "_surrogate_inflate_report"  # (flow.metadata, "client" | "server")

Method = Callable[..., Any]


class WebSocketLimit:
    """Per-flow glue: the pool's bound on the flow at its start, the metric at its end, and the
    check of a message that completed within one read."""

    def __init__(self, state: State) -> None:
        self.state = state

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
            self.state.metrics.limit_refusals.labels("websocket_message").inc()


def _held(ws: websocket.WebsocketConnection) -> tuple[int, int]:
    return sum(map(len, ws.frame_buf)), len(ws.frame_buf)


def _close(layer: Any, limit: int) -> Generator[Any, Any, None]:
    flow: http.HTTPFlow = layer.flow
    who = flow.metadata[TOO_BIG]
    reason = f"message larger than {limit} bytes"
    log.warning(
        "request %s: WebSocket message from the %s larger than %d bytes; closed with 1009",
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
            return
        for ws, who in sides:
            size, fragments = _held(ws)
            if size > limit or fragments > MAX_FRAGMENTS:
                self.flow.metadata.setdefault(TOO_BIG, who)
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
