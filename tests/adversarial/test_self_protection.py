"""Self-protection: the proxy's own listeners (the proxy port and the control API's TCP port) are
unreachable through the proxy in any spelling, and a request through the proxy to itself is
refused by resolved address and port, so it cannot loop. Defence: addons/resolve.py
(``Resolve._checked``: own ports on a local address, after resolution) with the own ports set in
proxy/engine/master.py ``build_master``.

The pool here allows every host on every port (opaque tunnels and plain HTTP), so only the
self-protection stands between the sandbox and the listeners.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from harness import ProxyProcess, free_port, status_line
from world import Stage, claim, egress, rules

SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "0x7f000001",
    "2130706433",
    "017700000001",
    "0",
    "0.0.0.0",
    "[::ffff:127.0.0.1]",
    "localhost",
    "LocalHost.",
    "[::1]",
]


@dataclass
class Own:
    proxy: ProxyProcess
    control_port: int
    auth: str = "Basic YzpzZWxmdG9rZW4="  # c:selftoken


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Own]:
    with Stage(tmp_path_factory.mktemp("own")) as st:
        st.token("selftoken", newline=False)
        st.token("operator-token-" + "x" * 16, file="operator", newline=False)
        text = rules(
            [egress("*", ports=[], intercept=False), egress("*", ports=[], scheme="http")],
            claims=[claim("c")],
        )
        control_port = free_port()
        control = [
            "--control-tcp",
            f"127.0.0.1:{control_port}",
            "--control-token-file",
            str(st.tmp / "operator"),
        ]
        proxy = st.proxy(text, upstream_ca=None, args=control)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{control_port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        yield Own(proxy, control_port)


def _exchange(own: Own, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", own.proxy.port), timeout=10) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionError:
            pass
    return out


def _ports(own: Own) -> dict[str, int]:
    return {"proxy": own.proxy.port, "control": own.control_port}


# the control listener's routes a sandbox would most like to reach: credentials, the approvals
# API (approving its own held request) and the approvals page (issue 16)
OWN_PATHS = ["/v1/claims", "/approvals", "/approvals/stream", "/ui/approvals", "/ui/login"]


@pytest.mark.parametrize("path", OWN_PATHS)
@pytest.mark.parametrize("which", ["proxy", "control"])
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_plain_http_to_an_own_listener_is_refused_in_any_spelling(
    own: Own, spelling: str, which: str, path: str
) -> None:
    authority = f"{spelling}:{_ports(own)[which]}"
    answer = _exchange(
        own,
        f"GET http://{authority}{path} HTTP/1.1\r\nHost: {authority}\r\n"
        f"Proxy-Authorization: {own.auth}\r\nConnection: close\r\n\r\n".encode(),
    )
    assert status_line(answer) == b"403" and b"own_listener" in answer, answer[:300]


@pytest.mark.parametrize("which", ["proxy", "control"])
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_tunnel_to_an_own_listener_is_closed_without_a_loop(own: Own, spelling: str, which: str) -> None:
    """The opaque rule allows the name, but the destination is one of the proxy's own
    listeners: the CONNECT is answered 403 own_listener (it was once 200 and a closed tunnel),
    and the proxy saw exactly one CONNECT (none through itself)."""
    authority = f"{spelling}:{_ports(own)[which]}"
    before = len([e for e in own.proxy.audit_events() if e.get("method") == "CONNECT"])
    answer = _exchange(
        own,
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: {own.auth}\r\n\r\n"
        f"GET /v1/claims HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode(),
    )
    # the proxy's own answers only (the pipelined GET, no longer inside a tunnel, meets the
    # proxy itself: 407); no response from the listener came back
    assert answer.startswith(b"HTTP/1.1 403") and b"own_listener" in answer, answer[:400]
    assert b"HTTP/1.1 200" not in answer
    assert answer.count(b"HTTP/1.1 ") == answer.count(b"X-Surrogate-Request-Id"), answer[:800]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        connects = [e for e in own.proxy.audit_events() if e.get("method") == "CONNECT"]
        if len(connects) > before:
            break
        time.sleep(0.05)
    assert len(connects) == before + 1, connects[before:]
    assert connects[-1]["reason"] == "own_listener" and connects[-1]["status"] == 403


def test_own_listener_refusals_are_audited(own: Own) -> None:
    reasons = {e.get("reason") for e in own.proxy.audit_events() if e.get("event") == "request"}
    assert "own_listener" in reasons
