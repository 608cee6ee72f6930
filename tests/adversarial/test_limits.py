"""Limits against a hostile sandbox: real bytes at a running proxy over loopback.

A claim that opens too many connections, sends too fast, dribbles a request head (slowloris) or
opens a connection and sits on it is refused or closed, and the refusals happen before any
upstream connection; a slow SSE response keeps working; ``--no-http2`` leaves an h2 client on
HTTP/1.1."""

from __future__ import annotations

import base64
import contextlib
import secrets
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import ProxyProcess
from servers import TestCA, Upstream
from world import Stage, claim, control, egress, rules

pytestmark = pytest.mark.e2e

HEADER_TIMEOUT = 2
IDLE_TIMEOUT = 6


@dataclass
class World:
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    tmp: Path
    ca: TestCA

    def auth(self, claim: str) -> str:
        return base64.b64encode(f"{claim}:{self.token}".encode()).decode()

    def connect(self, claim: str) -> tuple[socket.socket, bytes]:
        """A raw CONNECT to api.test as ``claim``: the socket and the proxy's answer head."""
        s = socket.create_connection(("127.0.0.1", self.proxy.port), timeout=10)
        target = f"api.test:{self.upstream.port}"
        s.sendall(
            f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            f"Proxy-Authorization: Basic {self.auth(claim)}\r\n\r\n".encode()
        )
        return s, _read_head(s)

    def client(self, claim: str, http2: bool = False) -> httpx.Client:
        return httpx.Client(
            proxy=self.proxy.url(claim, self.token),
            verify=ssl.create_default_context(cafile=str(self.proxy.ca_pem)),
            http2=http2,
            timeout=20,
        )

    def url(self, path: str) -> str:
        return f"https://api.test:{self.upstream.port}{path}"


def _read_head(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the peer closed ``s`` (EOF or reset), or None if still open after ``seconds``."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _rules(port: int) -> str:
    api = [egress("api.test", port)]
    return rules(
        pools={
            "few": {"egress": api, "limits": {"connections": 2}},
            "slow": {"egress": api, "limits": {"requests_per_second": 0.2, "burst": 3}},
            "free": {"egress": api},
        },
        claims=[claim("few", pool="few"), claim("slow", pool="slow"), claim("slow-h2", pool="slow")]
        + [claim("agent", pool="free")],
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("limits")) as st:
        token = st.token(secrets.token_urlsafe(16), newline=False)
        upstream = st.upstream(["api.test"])
        timeouts = ["--header-timeout", str(HEADER_TIMEOUT), "--idle-timeout", str(IDLE_TIMEOUT)]
        proxy = st.proxy(_rules(upstream.port), ["api.test"], args=timeouts)
        yield World(upstream, proxy, token, st.tmp, st.ca)


def test_a_connection_over_the_claims_limit_is_refused_before_any_upstream_connection(world: World) -> None:
    first, head1 = world.connect("few")
    second, head2 = world.connect("few")
    before = world.upstream.connections
    third, head3 = world.connect("few")
    with first, second, third:
        assert head1.startswith(b"HTTP/1.1 200") and head2.startswith(b"HTTP/1.1 200")
        assert head3.startswith(b"HTTP/1.1 429"), head3
        assert b"too_many_connections" in third.recv(65536) + head3
        assert _closed_within(third, 5) is not None  # Connection: close
        assert world.upstream.connections == before
        event = world.proxy.wait_event(event="tunnel", claim="few", reason="too_many_connections")
        assert event["status"] == 429 and event["decision"] == "deny"
        # another claim is not affected by this one's connections
        other, head = world.connect("agent")
        other.close()
        assert head.startswith(b"HTTP/1.1 200")
    time.sleep(0.5)  # the proxy sees both closes
    again, head = world.connect("few")
    again.close()
    assert head.startswith(b"HTTP/1.1 200"), head


def test_requests_over_the_claims_rate_get_429_with_retry_after(world: World) -> None:
    before = len(world.upstream.requests)
    with world.client("slow") as client:  # CONNECT + 2 requests use the burst of 3
        statuses = [client.get(world.url(f"/rate/{i}")) for i in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    refused = statuses[2]
    assert refused.json()["error"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 5
    assert [r.path for r in world.upstream.requests[before:]] == ["/rate/0", "/rate/1"]
    event = world.proxy.wait_event(claim="slow", path="/rate/2")
    assert (event["reason"], event["status"]) == ("rate_limited", 429)


def test_each_http2_stream_takes_a_token(world: World) -> None:
    """HTTP/2 multiplexes requests on one connection: each stream is a request for the rate, so
    a stream flood (rapid reset included) is answered 429 without reaching the upstream."""
    urls = [world.url(f"/h2-rate/{i}") for i in range(4)]
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-x", world.proxy.url("slow-h2", world.token)]
        + ["--cacert", str(world.proxy.ca_pem), "--http2", "-w", "\nstatus %{http_version} %{http_code}\n"]
        + urls,
        capture_output=True,
        timeout=30,
        check=False,
    )
    statuses = [line for line in done.stdout.decode().splitlines() if line.startswith("status ")]
    assert statuses == ["status 2 200", "status 2 200", "status 2 429", "status 2 429"], done
    assert [r.path for r in world.upstream.requests if r.path.startswith("/h2-rate/")] == [
        "/h2-rate/0",
        "/h2-rate/1",
    ]


def test_slowloris_head_is_closed_after_the_header_timeout(world: World) -> None:
    before = world.upstream.connections
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        start = time.monotonic()
        head = f"CONNECT api.test:{world.upstream.port} HTTP/1.1\r\nX-Slow: " + "a" * 100
        closed = False
        for ch in head.encode():
            try:
                s.sendall(bytes([ch]))
            except OSError:
                closed = True
                break
            if _closed_within(s, 0.25) is not None:
                closed = True
                break
        elapsed = time.monotonic() - start
    assert closed, "the proxy kept a dribbling request head open"
    assert HEADER_TIMEOUT - 0.5 < elapsed < HEADER_TIMEOUT + 3
    assert world.upstream.connections == before


def test_a_connection_that_never_sends_is_closed(world: World) -> None:
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        took = _closed_within(s, HEADER_TIMEOUT + 4)
    assert took is not None and took > HEADER_TIMEOUT - 0.5


def test_an_idle_tunnel_after_its_connect_is_closed(world: World) -> None:
    s, head = world.connect("agent")
    with s:
        assert head.startswith(b"HTTP/1.1 200")
        took = _closed_within(s, HEADER_TIMEOUT + 4)
    assert took is not None


def test_a_slow_sse_response_outlives_the_header_timeout(world: World) -> None:
    world.upstream.sse_release.clear()
    timer = threading.Timer(HEADER_TIMEOUT * 2, world.upstream.sse_release.set)
    timer.start()
    try:
        with world.client("agent") as client, client.stream("GET", world.url("/sse")) as r:
            body = b"".join(r.iter_raw())
    finally:
        timer.cancel()
        world.upstream.sse_release.set()
    assert body == b"data: one\n\ndata: two\n\n"


def test_a_silent_response_is_cut_by_the_idle_timeout(world: World) -> None:
    world.upstream.sse_release.clear()  # the upstream sends one event, then nothing for 10 s
    start = time.monotonic()
    try:
        with (
            world.client("agent") as client,
            client.stream("GET", world.url("/sse")) as r,
            contextlib.suppress(httpx.HTTPError),
        ):
            for _ in r.iter_raw():
                pass
    finally:
        world.upstream.sse_release.set()
    assert IDLE_TIMEOUT - 1 < time.monotonic() - start < 10


@pytest.mark.parametrize("http2", [True, False], ids=["default-h2", "no-http2"])
def test_no_http2_switch_leaves_an_h2_client_on_http11(world: World, tmp_path: Path, http2: bool) -> None:
    """curl offers h2 in ALPN; with ``--no-http2`` the proxy selects HTTP/1.1 (and still serves)."""
    switch = [] if http2 else ["--no-http2"]
    with Stage(tmp_path) as st:
        st.token(world.token, newline=False)
        proxy = st.proxy(_rules(world.upstream.port), ["api.test"], upstream_ca=world.ca.ca_pem, args=switch)
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-x", proxy.url("agent", world.token)]
            + ["--cacert", str(proxy.ca_pem), "--http2", "-w", "\n%{http_version} %{http_code}"]
            + [world.url("/h2")],
            capture_output=True,
            timeout=30,
            check=False,
        )
    assert done.stdout.rsplit(b"\n", 1)[-1] == (b"2 200" if http2 else b"1.1 200"), done


def test_limit_refusals_are_counted_with_bounded_labels(world: World) -> None:
    """Runs after the tests above in this module (file order): each limit has refused by now."""
    with control(world.proxy) as api:
        text = api.get("/metrics").text
    counted = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("surrogate_limit_refusals_total{")
    }
    assert set(counted) == {"connections", "rate", "header_timeout"}
    assert all(v >= 1 for v in counted.values())
