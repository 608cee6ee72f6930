"""addons/wsscrub.py: a WebSocket ping, pong or close frame from the upstream reaches the sandbox
with its payload or reason scrubbed, cut to what a control frame holds (RFC 6455 §5.5)."""

from __future__ import annotations

import wsproto.events

from addons.wsscrub import _scrub_control
from proxy.core.scrub import Scrubber

SECRET, PH = b"SECRETwsValue123", b"surr_WsScrubPlaceholderLonger0000001"


def test_ping_pong_and_close_payloads_are_scrubbed() -> None:
    scrubber = Scrubber([(SECRET, PH)])
    for kind in (wsproto.events.Ping, wsproto.events.Pong):
        out = _scrub_control(kind(payload=b"x" + SECRET), scrubber)
        assert isinstance(out, kind) and bytes(out.payload) == b"x" + PH
    close = _scrub_control(
        wsproto.events.CloseConnection(code=1000, reason="bye " + SECRET.decode()), scrubber
    )
    assert close.code == 1000 and close.reason == "bye " + PH.decode()


def test_a_payload_grown_by_the_placeholder_is_cut_to_a_control_frame() -> None:
    scrubber = Scrubber([(SECRET, PH)])
    ping = _scrub_control(wsproto.events.Ping(payload=SECRET * 7), scrubber)  # 112 bytes in
    assert len(ping.payload) == 125 and SECRET not in bytes(ping.payload)
    close = _scrub_control(wsproto.events.CloseConnection(code=1000, reason=SECRET.decode() * 7), scrubber)
    assert len(close.reason.encode()) == 123 and SECRET.decode() not in close.reason


def test_a_message_event_is_not_touched_here() -> None:
    message = wsproto.events.TextMessage(data="x")
    assert _scrub_control(message, Scrubber([(SECRET, PH)])) is message
