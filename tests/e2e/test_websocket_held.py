"""The bytes all WebSockets of one proxy process hold in unfinished messages are bounded
(``--websocket-held-bytes``), not only each message (r2 review of issue 20 item 3).

Before: the bound on one message (16 MiB by default) let a claim open many WebSockets, each
holding an unfinished message just under it; 12 connections of 15 MiB grew the proxy by 188 MiB,
and the default connection limit allows 256 of them. Now the WebSocket whose read takes the
process's total past the bound gets Close 1009, counted as ``limit="websocket_held"``. Real
clients and server (the ``websockets`` library), a real proxy process.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from harness import ProxyProcess
from test_websocket_limits import MIB, WsUpstream, rss_kib
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from world import Stage, claim, egress, metric, rules

pytestmark = pytest.mark.e2e

HELD = 48 * MIB  # the process's bound in this module
EACH = 15 * MIB  # one unfinished message per connection, under the 16 MiB message bound
CONNECTIONS = 8  # 120 MiB in all


@dataclass
class World:
    proxy: ProxyProcess
    upstream: WsUpstream

    def connect(self) -> ClientConnection:
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        return connect(
            f"wss://ws.test:{self.upstream.port}/echo",
            proxy=self.proxy.url("d", "tok"),
            ssl=ctx,
            open_timeout=30,  # a loaded 2-core machine
            max_size=None,
            compression=None,
        )

    def metric(self, limit: str) -> float:
        return metric(self.proxy, f'surrogate_limit_refusals_total{{limit="{limit}"}}')


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("wsheld")) as st:
        st.token("tok", newline=False)
        upstream = st.enter(WsUpstream(st.ca))
        text = rules([egress("ws.test", upstream.port)], pool="default", claims=[claim("d", pool="default")])
        # one process: the bound is per process, and its RSS is what is measured
        proxy = st.proxy(text, ["ws.test"], workers=1, args=["--websocket-held-bytes", str(HELD)])
        yield World(proxy, upstream)


class _Stop(Exception):
    """Ends a fragment generator without finishing its message."""


def test_many_unfinished_messages_together_are_bounded_per_process(world: World) -> None:
    before_metric = world.metric("websocket_held")
    before = rss_kib(world.proxy)
    stop = threading.Event()
    codes: list[int | None] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            send_one()
        except Exception as e:  # a connection that failed to open: named in the assertion
            with lock:
                codes.append(None)
                errors.append(repr(e))

    def send_one() -> None:
        block = b"\1" * (64 * 1024)
        with world.connect() as ws:

            def fragments() -> Iterator[bytes]:
                for _ in range(EACH // len(block)):
                    if ws.protocol.close_rcvd is not None:
                        break
                    yield block
                while not stop.is_set() and ws.protocol.close_rcvd is None:
                    time.sleep(0.05)
                raise _Stop  # never finish the message

            with contextlib.suppress(_Stop, ConnectionClosed, OSError):  # closed mid-message, or
                ws.send(fragments())  # stopped: the close frame says which
            with lock:
                codes.append(ws.protocol.close_rcvd.code if ws.protocol.close_rcvd else None)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(CONNECTIONS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    peak = before
    while time.monotonic() < deadline and len([c for c in codes if c == 1009]) < CONNECTIONS - HELD // EACH:
        peak = max(peak, rss_kib(world.proxy))
        time.sleep(0.2)
    time.sleep(1)  # what the open ones hold now
    peak = max(peak, rss_kib(world.proxy))
    stop.set()
    for t in threads:
        t.join(20)
    too_big = [c for c in codes if c == 1009]
    # 120 MiB offered, 48 MiB allowed: every connection that opened and was not closed with 1009
    # held its 15 MiB, and at most 3 of them fit under the bound
    assert not errors, errors
    assert len(too_big) >= CONNECTIONS - HELD // EACH, codes
    grown = (peak - before) >> 10
    assert grown < (HELD >> 20) + 32, f"proxy RSS grew {grown} MiB"
    assert world.metric("websocket_held") >= before_metric + len(too_big)


def test_a_websocket_within_the_bounds_still_passes(world: World) -> None:
    with world.connect() as ws:
        ws.send(b"x" * (8 * MIB))
        assert len(ws.recv(timeout=20)) == 8 * MIB
