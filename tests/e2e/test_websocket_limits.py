"""WebSocket messages are bounded in both directions (issue 20 item 3).

mitmproxy assembles a whole message before any hook runs; a message that never ends grew the
proxy 1:1 and forwarded nothing. Past the pool's ``limits.websocket_message_bytes`` (default
16 MiB) both sides get Close 1009 and both connections are closed; it is counted in
``surrogate_limit_refusals_total{limit="websocket_message"}``. Real clients and servers: the
``websockets`` library on both ends, TLS under a test CA, a real proxy process.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import ProxyProcess
from servers import TestCA
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from world import Stage, WsServer, claim, egress, metric, rules

pytestmark = pytest.mark.e2e
MIB = 1024 * 1024
SMALL = 64 * 1024  # the "small" pool's bound


def rss_kib(proxy: ProxyProcess) -> int:
    assert proxy.proc is not None
    status = Path(f"/proc/{proxy.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


class WsUpstream(WsServer):
    """A TLS WebSocket server: ``/echo`` echoes each message; ``/flood`` sends one message of
    300 MiB that it never finishes (fragments without FIN). No size limit of its own."""

    def __init__(self, ca: TestCA) -> None:
        super().__init__(ca, ["ws.test"], max_size=None)
        self.received: list[int] = []  # sizes of the messages it received
        self.close_codes: list[int | None] = []

    async def handler(self, ws: ServerConnection) -> None:
        path = ws.request.path if ws.request else ""
        try:
            if path.startswith("/flood"):
                await ws.send(self._flood())
            async for message in ws:
                self.received.append(len(message))
                await ws.send(message)
        except ConnectionClosed:
            pass
        finally:
            self.close_codes.append(ws.close_code)

    async def _flood(self) -> AsyncIterator[bytes]:
        block = b"\0" * (64 * 1024)
        for _ in range(300 * 16):  # 300 MiB, the end never reached
            yield block


@dataclass
class World:
    proxy: ProxyProcess
    upstream: WsUpstream

    def connect(self, claim: str, path: str, compression: str | None = None) -> ClientConnection:
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        try:
            return connect(
                f"wss://ws.test:{self.upstream.port}{path}",
                proxy=self.proxy.url(claim, "tok"),
                ssl=ctx,
                open_timeout=30,  # a loaded 2-core machine
                max_size=None,
                compression=compression,
            )
        except TimeoutError as e:
            # seen once in CI (a clean clone, both workers busy): the first handshake of the module
            # unanswered for 10 s; passes alone and under load. What the proxy said, for next time.
            audit = [(a.get("path"), a.get("status"), a.get("reason")) for a in self.proxy.audit_events()]
            raise AssertionError(
                f"{e}; upstream got {self.upstream.received}; audit {audit[-5:]}; "
                f"proxy stderr: {self.proxy.stderr()[-3000:]}"
            ) from e

    def metric(self) -> float:
        return metric(self.proxy, 'surrogate_limit_refusals_total{limit="websocket_message"}')


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("wslimits")) as st:
        st.token("tok", newline=False)
        upstream = st.enter(WsUpstream(st.ca))
        ws = [egress("ws.test", upstream.port)]
        text = rules(
            pools={
                "default": {"egress": ws},
                "small": {"egress": ws, "limits": {"websocket_message_bytes": SMALL}},
            },
            claims=[claim("d", pool="default"), claim("s", pool="small")],
        )
        yield World(st.proxy(text, ["ws.test"]), upstream)


def _close_code(ws: ClientConnection) -> int | None:
    try:
        ws.recv(timeout=20)
    except ConnectionClosed as e:
        return e.rcvd.code if e.rcvd is not None else None
    return None


def test_a_client_message_that_never_ends_is_closed_with_1009_in_flat_memory(world: World) -> None:
    """300 MiB in one unfinished message: the proxy's RSS grows by less than 64 MiB."""
    before_metric = world.metric()
    before = rss_kib(world.proxy)
    peak = before
    sent = 0
    block = b"\0" * (64 * 1024)

    def fragments() -> Iterator[bytes]:
        nonlocal sent, peak
        for i in range(300 * 16):  # 300 MiB, never finished
            sent += len(block)
            if i % 64 == 0:
                peak = max(peak, rss_kib(world.proxy))
            yield block

    with world.connect("d", "/echo") as ws:
        with pytest.raises((ConnectionClosed, OSError)):
            ws.send(fragments())
        code = _close_code(ws)
    peak = max(peak, rss_kib(world.proxy))
    assert (peak - before) < 64 * 1024, f"proxy RSS grew {(peak - before) >> 10} MiB"
    assert code == 1009
    assert sent < 300 * MIB  # the proxy stopped reading long before the end
    assert world.upstream.received == []  # nothing of it was forwarded
    assert world.metric() == before_metric + 1


def test_an_upstream_message_that_never_ends_is_closed_with_1009_in_flat_memory(world: World) -> None:
    before_metric = world.metric()
    before = rss_kib(world.proxy)
    with world.connect("d", "/flood") as ws:
        code = _close_code(ws)
    grown = rss_kib(world.proxy) - before
    assert code == 1009
    assert grown < 64 * 1024, f"proxy RSS grew {grown >> 10} MiB"
    assert world.metric() == before_metric + 1


@pytest.mark.parametrize("compression", [None, "deflate"], ids=["plain", "permessage-deflate"])
def test_the_pools_bound_holds_and_a_message_within_it_passes(world: World, compression: str | None) -> None:
    with world.connect("s", "/echo", compression) as ws:
        ws.send(b"a" * (SMALL - 1024))
        assert len(ws.recv(timeout=10)) == SMALL - 1024
        ws.send(b"b" * (SMALL + 1))  # complete, in one or two reads
        assert _close_code(ws) == 1009
    with world.connect("s", "/echo", compression) as ws:
        ws.send([b"c" * 1000] * (SMALL // 1000 + 1))  # fragmented, past the bound
        assert _close_code(ws) == 1009


def test_a_compressed_message_is_bounded_by_its_inflated_size(world: World) -> None:
    """permessage-deflate (RFC 7692): 8 MiB of zeros deflate to a few KiB; the pool's 64 KiB
    bound counts what it inflates to."""
    with world.connect("s", "/echo", "deflate") as ws:
        assert ws.protocol.extensions, "permessage-deflate was not negotiated"
        ws.send(b"\0" * (8 * MIB))
        assert _close_code(ws) == 1009


def test_a_deflate_bomb_never_inflates_past_the_bound(world: World) -> None:
    """200 MiB of zeros in one compressed message (a few hundred KiB on the wire): mitmproxy's
    inflater had no bound; the proxy's RSS grows by less than 64 MiB."""
    before = rss_kib(world.proxy)
    with world.connect("d", "/echo", "deflate") as ws:
        assert ws.protocol.extensions, "permessage-deflate was not negotiated"
        with contextlib.suppress(ConnectionClosed, OSError):
            ws.send(b"\0" * (200 * MIB))
        assert _close_code(ws) == 1009
    grown = rss_kib(world.proxy) - before
    assert grown < 64 * 1024, f"proxy RSS grew {grown >> 10} MiB"
    assert 200 * MIB not in world.upstream.received


def test_the_default_bound_lets_a_large_message_through(world: World) -> None:
    with world.connect("d", "/echo") as ws:
        ws.send(b"x" * (8 * MIB))
        assert len(ws.recv(timeout=20)) == 8 * MIB
