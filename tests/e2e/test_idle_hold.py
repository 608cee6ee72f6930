"""Review r-perf: mitmproxy's connection watchdog with surrogate's class-based ``disarm``
(proxy/engine/watchdog.py, issue 19), through a real proxy with a short ``--idle-timeout``: a
request held in a hook (an approval nobody answers for twice the idle timeout) is not timed
out while held; once answered, the then idle connection is closed by the idle timeout again
(the watchdog re-armed after the hook). The other idle cases (a silent response, an idle
tunnel): tests/adversarial/test_limits.py."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, egress, rules

pytestmark = pytest.mark.e2e
IDLE_TIMEOUT = 2


@dataclass
class World:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("idlehold")) as st:
        token = st.token()
        up = st.upstream(["api.test"])
        text = rules(
            [egress("api.test", up.port, approve={"methods": ["POST"], "paths": ["/echo"], "timeout": 30})],
            claims=[claim("c1")],
        )
        proxy = st.proxy(text, resolve=["api.test"], control=True, args=["--idle-timeout", str(IDLE_TIMEOUT)])
        yield World(st, up, proxy, token)


def _tunnel(w: World) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", w.proxy.port), timeout=20)
    target = f"api.test:{w.upstream.port}"
    auth = base64.b64encode(f"c1:{w.token}".encode()).decode()
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    raw.sendall(head.encode())
    assert _head(raw).startswith(b"HTTP/1.1 200")
    tls = ssl.create_default_context(cafile=str(w.proxy.ca_pem)).wrap_socket(raw, server_hostname="api.test")
    return tls


def _head(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and (chunk := s.recv(65536)):
        data += chunk
    return data


def _pending(w: World) -> str:
    deadline = time.monotonic() + 10
    with control(w.proxy) as api:
        while time.monotonic() < deadline:
            got = api.get("/approvals", params={"state": "pending"})
            if got.json():
                return str(got.json()[0]["id"])
            time.sleep(0.05)
    raise AssertionError("no pending approval")


def _closed_after(s: socket.socket, seconds: float) -> float | None:
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except (ConnectionResetError, ssl.SSLError):
        pass
    return time.monotonic() - start


def test_a_request_held_past_the_idle_timeout_is_answered_and_the_idle_connection_then_closed(
    world: World,
) -> None:
    with _tunnel(world) as s:
        port = world.upstream.port
        request = f"POST /echo/held HTTP/1.1\r\nHost: api.test:{port}\r\nContent-Length: 2\r\n\r\n{{}}"
        s.sendall(request.encode())
        approval = _pending(world)
        time.sleep(IDLE_TIMEOUT * 2)  # held, the client silent: no byte either way
        with control(world.proxy) as api:
            assert api.post(f"/approvals/{approval}/approve", json={"scope": "once"}).status_code == 200
        head = _head(s)
        world.stage.received.append(head)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        took = _closed_after(s, IDLE_TIMEOUT + 6)  # the response read, the connection now idle
    assert took is not None, "the idle connection was never closed after the held request"
    assert sum(1 for r in list(world.upstream.requests) if r.path == "/echo/held") == 1
