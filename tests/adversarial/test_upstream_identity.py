"""A request reaches exactly the upstream it was decided for (issue 13, class 3; DESIGN.md
invariants 8 and 10).

api.test and other.test are two names on one address (both pinned to 127.0.0.1, one upstream
whose certificate covers both). The upstream records the SNI of every TLS session it accepts
(``Upstream.sessions``) and the session each request came over (``Recorded.session``), so the
tests count sessions and prove that a request carrying the secret went over a session opened for
its own name. Defences: addons/reuse.py (connections are matched on the name, not the address),
addons/policy.py (the request target's authority must be the tunnel's).
"""

from __future__ import annotations

import http.client
import socket
import ssl

import pytest
from harness import World, status_line


def _exchange(sock: socket.socket | ssl.SSLSocket, head: str) -> tuple[int, bytes]:
    """Send one request head on ``sock`` and read one whole response (status, body)."""
    sock.sendall(head.encode())
    resp = http.client.HTTPResponse(sock)  # type: ignore[arg-type]
    resp.begin()
    return resp.status, resp.read()


def _sessions_of(world: World, path: str) -> list[str | None]:
    """The SNI of the TLS session each request for ``path`` arrived on."""
    return [world.upstream.sessions[r.session] for r in world.upstream.requests if r.path == path]


def _secret_went_over_own_sessions(world: World) -> None:
    """Every request the upstream got with the secret came over a session whose SNI is the name
    its Host header says (the only name the secret is bound to, here: api.test)."""
    for r in world.upstream.requests:
        auth = [v for k, v in r.headers if k.lower() == "authorization"]
        if any(world.secret in v for v in auth):
            host = next(v for k, v in r.headers if k.lower() == "host").rsplit(":", 1)[0]
            assert host == "api.test" and world.upstream.sessions[r.session] == "api.test", r.path


@pytest.mark.parametrize(
    ("first", "tag"), [("other.test", "name"), ("OTHER.test.", "spelling")], ids=["other-name", "other-spelling"]
)
def test_absolute_form_requests_for_two_names_on_one_address_get_two_sessions(
    world: World, first: str, tag: str
) -> None:
    """Was: GET https://other.test/ then GET https://api.test/ with the placeholder on one
    explicit-proxy connection: the second request (and the secret) went over the TLS session
    opened with SNI other.test, because mitmproxy reuses an upstream connection by address."""
    port, auth = world.upstream.port, world.proxy_auth()
    before = len(world.upstream.sessions)
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
        status1, _ = _exchange(
            s,
            f"GET https://{first}:{port}/abs-{tag}-1 HTTP/1.1\r\nHost: {first}:{port}\r\n"
            f"Proxy-Authorization: {auth}\r\n\r\n",
        )
        status2, body2 = _exchange(
            s,
            f"GET https://api.test:{port}/v1/abs-{tag}-2 HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Authorization: Bearer {world.placeholder}\r\nProxy-Authorization: {auth}\r\n\r\n",
        )
        status3, _ = _exchange(  # the same name again: its own session is reused
            s,
            f"GET https://api.test:{port}/v1/abs-{tag}-3 HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Authorization: Bearer {world.placeholder}\r\nProxy-Authorization: {auth}\r\n\r\n",
        )
    world.received.append(body2)
    assert (status1, status2, status3) == (200, 200, 200)
    assert _sessions_of(world, f"/abs-{tag}-1") == ["other.test"]
    assert _sessions_of(world, f"/v1/abs-{tag}-2") == ["api.test"]
    assert _sessions_of(world, f"/v1/abs-{tag}-3") == ["api.test"]
    assert world.upstream.sessions[before:] == ["other.test", "api.test"]  # two names, two sessions
    _secret_went_over_own_sessions(world)


def test_keep_alive_reuse_still_works_for_one_name(world: World) -> None:
    """Three requests for one name on one connection share one upstream session."""
    port, auth = world.upstream.port, world.proxy_auth()
    before = len(world.upstream.sessions)
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
        for i in range(3):
            status, _ = _exchange(
                s,
                f"GET https://other.test:{port}/reuse-{i} HTTP/1.1\r\nHost: other.test:{port}\r\n"
                f"Proxy-Authorization: {auth}\r\n\r\n",
            )
            assert status == 200
    assert world.upstream.sessions[before:] == ["other.test"]
