"""WebSocket through the proxy: the placeholder in the handshake header is swapped, and
messages flow both ways as they are sent (the upstream answers before the client is done)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ProxyProcess
from servers import TestCA
from websockets.asyncio.server import ServerConnection
from websockets.sync.client import connect
from world import Stage, WsServer, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_WebSocketPlaceholder0001"


def rss_kib(proxy: ProxyProcess) -> int:
    assert proxy.proc is not None
    status = Path(f"/proc/{proxy.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


class WsUpstream(WsServer):
    """A TLS WebSocket server on loopback that records the handshake's Authorization header."""

    def __init__(self, ca: TestCA) -> None:
        super().__init__(ca, ["api.test"])
        self.auth: list[str] = []

    async def handler(self, ws: ServerConnection) -> None:
        self.auth.append(ws.request.headers.get("Authorization", "") if ws.request else "")
        async for message in ws:
            await ws.send(f"echo:{message}")


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[ProxyProcess, WsUpstream, str]]:
    with Stage(tmp_path) as st:
        secret = st.secret("ws", file="secret")
        st.token("tok", newline=False)
        upstream = st.enter(WsUpstream(st.ca))
        text = rules(
            [egress("api.test", upstream.port)],
            claim_id="c",
            credentials=[credential("ws", PH, ["api.test"], "file:secret")],
        )
        yield st.proxy(text, ["api.test"]), upstream, secret


def test_websocket_handshake_gets_the_secret_and_messages_stream(
    world: tuple[ProxyProcess, WsUpstream, str],
) -> None:
    proxy, upstream, secret = world
    ctx = ssl.create_default_context(cafile=proxy.ca_pem)
    with connect(
        f"wss://api.test:{upstream.port}/ws",
        proxy=proxy.url("c", "tok"),
        ssl=ctx,
        additional_headers={"Authorization": f"Bearer {PH}"},
        open_timeout=30,  # a loaded 2-core machine
    ) as ws:
        for i in range(50):  # one at a time: each answer must arrive before the next is sent
            ws.send(f"m{i}")
            assert ws.recv(timeout=5) == f"echo:m{i}"
        # 40 MB more, in 400 messages: the proxy must not keep them (mitmproxy would, per flow)
        before = rss_kib(proxy)
        blob = "x" * 100_000
        for _ in range(400):
            ws.send(blob)
            assert len(ws.recv(timeout=10)) == len(blob) + 5
        grown = rss_kib(proxy) - before
    assert grown < 20 * 1024, f"proxy RSS grew {grown} KiB over a 40 MB WebSocket session"
    assert upstream.auth == [f"Bearer {secret}"]
    event = proxy.wait_event(path="/ws")
    assert event["status"] == 101 and event["credentials"] == [{"name": "ws", "version": 1}]
