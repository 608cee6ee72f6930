"""A tunnel that idled after its handshake still gets every check on its first request (issue 19).

What the idle-tunnel cuts release or share (addons/tlsshare.py: one OpenSSL copy of each leaf and
of the key among the client connections of that leaf; proxy/engine/layerqueue.py: no empty paused
event queue per layer) must not change what a later request on that tunnel is decided by: the
claim, the CONNECT host, the pinned address, the leaf the client verified. Several tunnels to two
hosts are held idle at once, interleaved, then each sends one request."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator

from harness import World, status_line

IDLE_S = 2.0


@contextlib.contextmanager
def _idle_tunnels(world: World, hosts: list[str]) -> Iterator[list[ssl.SSLSocket]]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(world.tls_tunnel(h, timeout=20)) for h in hosts]
        time.sleep(IDLE_S)
        yield socks


def _send(world: World, tls: ssl.SSLSocket, head: str) -> bytes:
    data = b""
    tls.sendall(head.encode())
    with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
        while chunk := tls.recv(65536):
            data += chunk
    world.received.append(data)
    return data


def _sans(tls: ssl.SSLSocket) -> list[str]:
    cert = tls.getpeercert()
    assert cert is not None
    return [v for k, v in cert.get("subjectAltName", ()) if k == "DNS"]


def test_idle_tunnels_each_present_their_own_leaf(world: World) -> None:
    """Leaves are shared per name, never across names: each verified handshake (the client checks
    the name) saw a certificate for its own CONNECT host."""
    hosts = ["api.test", "other.test", "api.test", "other.test", "api.test"]
    with _idle_tunnels(world, hosts) as socks:
        for host, tls in zip(hosts, socks, strict=True):
            assert host in _sans(tls)
            assert [h for h in ("api.test", "other.test") if h in _sans(tls)] == [host]


def test_a_request_after_idling_gets_the_secret_only_toward_its_host(world: World) -> None:
    port = world.upstream.port
    heads = {
        "api.test": f"GET /v1/idle-ok HTTP/1.1\r\nHost: api.test:{port}\r\n"
        f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n",
        # other.test is allowed, but the credential is bound to api.test: its placeholder is refused
        "other.test": f"GET /idle-other HTTP/1.1\r\nHost: other.test:{port}\r\n"
        f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n",
    }
    with _idle_tunnels(world, ["other.test", "api.test"]) as (other, api):
        got_api = _send(world, api, heads["api.test"])
        got_other = _send(world, other, heads["other.test"])
    assert status_line(got_api) == b"200", got_api[:300]
    (sent,) = [r for r in world.upstream.requests if r.path == "/v1/idle-ok"]
    assert ("Authorization", f"Bearer {world.secret}") in sent.headers
    assert world.upstream.sessions[sent.session] == "api.test"
    assert status_line(got_other) == b"403" and b"placeholder_violation" in got_other, got_other[:300]
    assert world.paths("/idle-other") == []
    event = world.proxy.wait_event(path="/v1/idle-ok")
    assert event.get("claim") == "agent"


def test_a_request_after_idling_is_still_refused_by_policy_and_authority(world: World) -> None:
    port = world.upstream.port
    with _idle_tunnels(world, ["api.test", "api.test"]) as (post_tls, evil_tls):
        # the api.test rule allows GET /v1* only
        post = _send(
            world,
            post_tls,
            f"POST /v1/idle-post HTTP/1.1\r\nHost: api.test:{port}\r\nContent-Length: 0\r\n"
            f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n",
        )
        # a request for another host inside the api.test tunnel
        evil = _send(
            world,
            evil_tls,
            f"GET /v1/idle-evil HTTP/1.1\r\nHost: evil.test:{port}\r\n"
            f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n",
        )
    assert status_line(post) == b"403", post[:300]
    assert status_line(evil) == b"421" and b"authority_mismatch" in evil, evil[:300]
    assert world.paths("/v1/idle-post") == [] and world.paths("/v1/idle-evil") == []


def _tunnel(world: World, ctx: ssl.SSLContext, session: ssl.SSLSession | None) -> ssl.SSLSocket:
    port = world.upstream.port
    raw = socket.create_connection(("127.0.0.1", world.proxy.port), timeout=20)
    raw.sendall(
        f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n"
        f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
    )
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    return ctx.wrap_socket(raw, server_hostname="api.test", session=session)


def test_a_client_resumes_its_tls_session_on_the_next_tunnel_after_idling(world: World) -> None:
    """TLS 1.3 resumption toward the client (RFC 8446 §2.2) still works with the shared leaf and
    key, after the first tunnel idled: the next tunnel offers its ticket and is resumed, and its
    request is served as the first's."""
    port = world.upstream.port
    head = (
        f"GET /v1/idle-resume HTTP/1.1\r\nHost: api.test:{port}\r\n"
        f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n"
    )
    ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))  # a session resumes in its context
    ctx.set_alpn_protocols(["http/1.1"])
    with _tunnel(world, ctx, None) as first:
        time.sleep(IDLE_S)
        assert status_line(_send(world, first, head)) == b"200"  # reading the response reads the ticket
        session = first.session
    assert session is not None
    with _tunnel(world, ctx, session) as second:
        assert second.session_reused
        assert status_line(_send(world, second, head)) == b"200"
    assert len(world.paths("/v1/idle-resume")) == 2
