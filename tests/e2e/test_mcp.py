"""An MCP client (the official `mcp` SDK, streamable HTTP) through the proxy to a TLS MCP server.

The client holds only the placeholder, in `Authorization: Bearer`; the server (its own process,
`_mcp_server.py`) answers 401 to anything but the real secret. Its tool streams progress
notifications and holds after the first one until the test has seen it arrive at the client, so
the test proves, without timing guesses, that the proxy forwards the SSE response as it is sent.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import canary
import httpx2
import pytest
from harness import ROOT, ProxyProcess, free_port
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from servers import TestCA
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_McpServerPlaceholder0001"
HOST = "mcp.test"
SERVER_SCRIPT = Path(__file__).with_name("_mcp_server.py")


@dataclass
class World:
    proxy: ProxyProcess
    port: int  # the MCP server's
    secret: str
    auth_log: Path  # one Authorization value per request the server received
    release: Path  # created by the test to let the tool go on past its first notification

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}/mcp"


def start_server(tmp: Path, ca: TestCA, port: int) -> subprocess.Popen[bytes]:
    tls = tmp / "mcp-server.pem"
    ca.ca.issue_cert(HOST).private_key_and_cert_chain_pem.write_to_path(str(tls))
    stderr = (tmp / "mcp-server.stderr").open("wb")
    with stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER_SCRIPT),
                "--port",
                str(port),
                "--tls",
                str(tls),
                "--secret-file",
                str(tmp / "secret"),
                "--auth-log",
                str(tmp / "auth.log"),
                "--release",
                str(tmp / "release"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"MCP server exited {proc.returncode}: {(tmp / 'mcp-server.stderr').read_text()}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    stop_server(proc)
    raise RuntimeError("MCP server did not listen within 20 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with Stage(tmp_path) as st:
        secret = st.secret("mcp", file="secret")
        canary.exempt(tmp_path / "auth.log")  # the MCP server's record of the Authorization it got
        st.token("tok", newline=False)
        port = free_port()
        text = rules(
            [egress(HOST, port)], claim_id="c", credentials=[credential("mcp", PH, [HOST], "file:secret")]
        )
        server = start_server(tmp_path, st.ca, port)
        st.defer(stop_server, server)
        proxy = st.proxy(text, [HOST])
        yield World(proxy, port, secret, tmp_path / "auth.log", tmp_path / "release")


@dataclass
class TeeTransport(httpx2.AsyncBaseTransport):
    """Wraps the real transport and keeps every byte of every response the client receives."""

    inner: httpx2.AsyncBaseTransport
    received: list[bytes] = field(default_factory=list)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        self.received.append(f"{response.status_code} {response.headers.multi_items()}".encode())
        response.stream = _TeeStream(response.stream, self.received)  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class _TeeStream(httpx2.AsyncByteStream):
    inner: httpx2.AsyncByteStream
    sink: list[bytes]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.sink.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_mcp_tool_call_streams_progress_through_the_proxy(world: World) -> None:
    ctx = ssl.create_default_context(cafile=world.proxy.ca_pem)
    tee = TeeTransport(
        httpx2.AsyncHTTPTransport(verify=ctx, proxy=world.proxy.url("c", "tok"), trust_env=False)
    )
    arrivals: list[tuple[float, float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        arrivals.append((time.monotonic(), progress, message))
        if len(arrivals) == 1:
            world.release.touch()  # only now may the server go on and, eventually, answer

    http = httpx2.AsyncClient(
        transport=tee,
        trust_env=False,
        headers={"Authorization": f"Bearer {PH}"},
        timeout=httpx2.Timeout(20, read=20),
    )
    async with (
        http,
        streamable_http_client(world.url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=20) as session,
    ):
        init = await session.initialize()
        assert init.server_info.name == "surrogate-e2e"
        tools = await session.list_tools()
        assert [t.name for t in tools.tools] == ["stepwise"]
        result = await session.call_tool("stepwise", {}, progress_callback=on_progress)
        done_at = time.monotonic()

    assert not result.is_error, result
    assert [c.text for c in result.content if c.type == "text"] == ["stepwise done"]
    assert [(p, m) for _, p, m in arrivals] == [(1, "first"), (2, "second"), (3, "third")]
    # The release gate already proves the first arrived before the result was sent; the times
    # show the later ones were not held back either (the server sleeps 300 ms after each).
    first, second, third = (t for t, _, _ in arrivals)
    assert done_at - first >= 0.5 and third - first >= 0.5
    assert done_at - second >= 0.15

    # The server saw only the real secret, on every request (initialize, list, call, GET, DELETE).
    seen = world.auth_log.read_text().splitlines()
    assert len(seen) >= 4 and set(seen) == {f"Bearer {world.secret}"}
    # ...and the client never saw it, in any status line, header or body byte.
    received = b"".join(tee.received)
    assert b"stepwise done" in received
    assert world.secret.encode() not in received
    events = [e for e in world.proxy.audit_events() if e.get("host") == HOST]
    assert events and all(e["credentials"] == [{"name": "mcp", "version": 1}] for e in events), events
    assert {e["method"] for e in events} >= {"POST"}
