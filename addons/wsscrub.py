"""scrub, for WebSockets: messages from the upstream, and its ping, pong and close frames,
scrubbed before they reach the sandbox (the rest of the response path: :mod:`addons.scrub`).
"""

from __future__ import annotations

import time
from typing import Any

import wsproto.events
from mitmproxy import http
from mitmproxy.proxy.layers import websocket as websocket_layer

from addons import facts
from addons.scrubpairs import PairCache, claims_now
from proxy.core.policy import Claim
from proxy.core.scrub import Scrubber
from proxy.engine.state import State

_CONTROL_PAYLOAD = 125  # bytes: a control frame's payload at most (RFC 6455 §5.5)
# client connection id -> the claim whose WebSocket it carries, and the state to read it again
# from (set in websocket_start)
_WS_CLAIMS: dict[str, tuple[Claim, State | None]] = {}


_CONTROL_PAIRS = PairCache()
_MARK = "_surrogate_scrub_control"


def _scrub_control(event: Any, scrubber: Scrubber) -> Any:
    """A ping, pong or close frame toward the sandbox, its payload or reason scrubbed (cut to
    what a control frame holds: the placeholder may be longer than the secret)."""
    if isinstance(event, wsproto.events.Ping | wsproto.events.Pong):
        return type(event)(payload=scrubber.scrub(bytes(event.payload))[:_CONTROL_PAYLOAD])
    if isinstance(event, wsproto.events.CloseConnection) and event.reason:
        reason = scrubber.scrub(event.reason.encode())[: _CONTROL_PAYLOAD - 2]
        return wsproto.events.CloseConnection(code=event.code, reason=reason.decode("utf-8", "ignore"))
    return event


def _install_control_scrub() -> None:
    """Wrap mitmproxy's ``WebsocketConnection.send2`` (once per process): the layer forwards a
    ping, pong or close frame from the upstream as it is, with no hook, so its payload is
    scrubbed where it is written to a sandbox's connection."""
    original = websocket_layer.WebsocketConnection.send2
    if getattr(original, _MARK, False):
        return

    def send2(self: Any, event: Any) -> Any:
        entry = _WS_CLAIMS.get(self.conn.id)
        if entry is not None and not isinstance(event, wsproto.events.Message):
            try:
                for claim in claims_now(*entry):
                    pairs, compiled = _CONTROL_PAIRS.get(claim, time.time())
                    event = _scrub_control(event, Scrubber(pairs, compiled=compiled))
            except Exception as e:  # fail closed: a payload we cannot check is not sent
                facts.log.error(
                    "scrub of a WebSocket control frame failed with %s; emptied", type(e).__name__
                )
                if isinstance(event, wsproto.events.Ping | wsproto.events.Pong):
                    event = type(event)(payload=b"")
                elif isinstance(event, wsproto.events.CloseConnection):
                    event = wsproto.events.CloseConnection(code=event.code)
        return original(self, event)

    setattr(send2, _MARK, True)
    websocket_layer.WebsocketConnection.send2 = send2  # type: ignore[method-assign]


class ScrubMessages:
    """WebSocket messages from the upstream, text and binary, scrubbed whole before they are
    forwarded (mitmproxy calls ``websocket_message`` with the complete message and sends
    ``message.content`` on afterwards). This addon runs before ``stream``, which lets every
    message go from ``flow.websocket.messages``; a message is bounded by the WebSocket size
    limit, so scrubbing it whole holds nothing that is not held already. A text message stays
    valid UTF-8: a placeholder is ASCII. Escaped forms are sought in binary messages too (they
    often carry JSON or form-encoded text). Ping, pong and close frames have no hook: their
    payloads and close reasons are scrubbed where mitmproxy writes them to the sandbox
    (:func:`_install_control_scrub`). Both use the claim as it is now as well as the one the
    WebSocket was opened with (:func:`addons.scrubpairs.claims_now`)."""

    def __init__(self, state: State | None = None) -> None:
        self.pairs = PairCache()
        self.state = state  # to read the claim as it is now (claims_now)
        _install_control_scrub()

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if claim is not None and claim.credentials:
            _WS_CLAIMS[flow.client_conn.id] = (claim, self.state)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        _WS_CLAIMS.pop(flow.client_conn.id, None)

    def client_disconnected(self, client: Any) -> None:
        _WS_CLAIMS.pop(client.id, None)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if flow.websocket is None or not flow.websocket.messages or claim is None or not claim.credentials:
            return
        message = flow.websocket.messages[-1]
        if message.from_client:
            return
        try:
            content = message.content
            for current in claims_now(claim, self.state):
                pairs, compiled = self.pairs.get(current, time.time())
                content = Scrubber(pairs, compiled=compiled).scrub(content)
            message.content = content
        except Exception as e:  # fail closed: a message we cannot check is not passed
            facts.log.error("scrub.websocket_message failed with %s; connection closed", type(e).__name__)
            message.drop()
            if flow.killable:
                flow.kill()
