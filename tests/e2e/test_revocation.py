"""Revocation is the same for every claim (issue 13 class 8): a rules-file claim whose proxy token
changes (its token file rewritten, or a rules reload pointing it elsewhere, or the claim removed)
has its open tunnels refused from the very next request and closed by the poll, as store
claims' tunnels are when their token is rotated."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ProxyProcess
from servers import Upstream
from test_reload import wait_reload
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e


def _rules(
    port: int, token_file: str, with_claim: bool = True, held: list[dict[str, Any]] | None = None
) -> str:
    """Pool ``p`` to api.test; claim ``c`` (unless not ``with_claim``) with token ``token_file``
    holding the credentials ``held``."""
    claims = [claim("c", held or [], token=f"file:{token_file}")] if with_claim else []
    return rules([egress("api.test", port)], claims=claims)


@dataclass
class Setup:
    tmp: Path
    upstream: Upstream
    proxy: ProxyProcess
    rules: Path

    def client(self, token: str) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        return httpx.Client(proxy=self.proxy.url("c", token), verify=ctx, timeout=10)

    def url(self, path: str) -> str:
        return f"https://api.test:{self.upstream.port}{path}"

    def received(self, prefix: str) -> list[str]:
        return [r.path for r in self.upstream.requests if r.path.startswith(prefix)]


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    with Stage(tmp_path) as st:
        st.token("old-token-0001", newline=False)
        upstream = st.upstream(["api.test"])
        proxy = st.proxy(_rules(upstream.port, "token"), ["api.test"])
        yield Setup(tmp_path, upstream, proxy, proxy.rules)


def _replace(path: Path, text: str) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def _refused(client: httpx.Client, url: str) -> None:
    """The open tunnel carries nothing more: a 407 inside it, or a closed connection whose
    reconnect is refused with 407."""
    try:
        r = client.get(url)
    except httpx.ProxyError as e:
        assert "407" in str(e)
        return
    except httpx.RemoteProtocolError:  # the poll closed the idle tunnel first: reconnect
        with pytest.raises(httpx.ProxyError, match="407"):
            client.get(url)
        return
    assert r.status_code == 407, r.text


def test_a_rewritten_token_file_revokes_the_open_tunnel_on_the_next_request(setup: Setup) -> None:
    with setup.client("old-token-0001") as client:
        assert client.get(setup.url("/rev/1")).status_code == 200
        _replace(setup.tmp / "token", "new-token-0000002")
        _refused(client, setup.url("/rev/2"))  # at once: no wait for any poll
    assert setup.received("/rev") == ["/rev/1"]
    with setup.client("new-token-0000002") as client:
        assert client.get(setup.url("/rev/3")).status_code == 200


def test_an_idle_tunnel_is_closed_when_its_token_changes(setup: Setup) -> None:
    with setup.client("old-token-0001") as client:
        assert client.get(setup.url("/idle/1")).status_code == 200
        _replace(setup.tmp / "token", "new-token-0000002")
        time.sleep(0.8)  # the poll runs every 0.2 s
        with pytest.raises(httpx.TransportError):
            # closed by the proxy; httpx reconnects and the old token's CONNECT gets 407
            client.get(setup.url("/idle/2"))
    assert setup.received("/idle") == ["/idle/1"]


@pytest.mark.parametrize("change", ["other-token-file", "claim-removed"])
def test_a_rules_reload_revokes_the_open_tunnel(setup: Setup, change: str) -> None:
    (setup.tmp / "token2").write_text("reloaded-token-03")
    with setup.client("old-token-0001") as client:
        assert client.get(setup.url("/reload/1")).status_code == 200
        _replace(setup.rules, _rules(setup.upstream.port, "token2", with_claim=change != "claim-removed"))
        assert wait_reload(setup.proxy, 1)[0]["outcome"] == "applied"
        _refused(client, setup.url("/reload/2"))
    assert setup.received("/reload") == ["/reload/1"]


# -- hostile review (r1): a store claim deleted and created again under the same id ----------


def test_a_claim_id_deleted_and_created_again_does_not_hand_the_old_tunnel_to_the_new_claim(
    tmp_path: Path,
) -> None:
    """Was: an orchestrator that deletes claim ``sb`` (its sandbox is gone) and creates ``sb``
    again for the next tenant, within one 0.2 s poll, left the old sandbox's open tunnel
    working: both claims were at version 1, so the registry saw no change, and the old tunnel's
    next request carried the *new* tenant's credential, swapped in. A tunnel belongs to the
    claim that opened it: the next request in it is refused and the upstream never sees the
    new claim's secret."""
    from test_control import control_world

    with control_world(tmp_path) as world:
        with world.api() as api:
            old = api.post("/v1/claims", json={"id": "sb", "pool": "p"}).json()["proxy_token"]
            with world.client("sb", old) as client:
                assert client.get(world.url("/gen/1")).status_code == 200
                # one keep-alive API connection: the delete and the create land within a few ms
                assert api.delete("/v1/claims/sb").status_code == 204
                assert api.post("/v1/claims", json={"id": "sb", "pool": "p"}).status_code == 201
                secret = world.canary()
                r = api.put("/v1/claims/sb/credentials/gh", json={"hosts": ["api.test"], "value": secret})
                assert r.status_code == 201, r.text
                placeholder = r.json()["placeholder"]
                _refused_or_closed(client, world.url("/gen/2"), {"Authorization": f"Bearer {placeholder}"})
        assert [r.path for r in world.upstream.requests if r.path.startswith("/gen")] == ["/gen/1"]
        assert world.sent("/gen/2", "Authorization") == []


def _refused_or_closed(client: httpx.Client, url: str, headers: dict[str, str]) -> None:
    """Like :func:`_refused`, for a tunnel the poll may close first."""
    try:
        r = client.get(url, headers=headers)
    except (httpx.ProxyError, httpx.RemoteProtocolError, httpx.ConnectError) as e:
        assert "407" in str(e) or isinstance(e, httpx.RemoteProtocolError), e
        return
    assert r.status_code == 407, r.text


def test_every_multiplexed_http2_stream_of_a_revoked_tunnel_is_refused(tmp_path: Path) -> None:
    """The token file is rewritten while an HTTP/2 tunnel (client and upstream both h2) is open;
    eight streams sent on it at once afterwards are each refused (407) or find the connection
    closed: none reaches the upstream, and none carries the credential."""
    import threading

    from asgi_upstream import AsgiUpstream

    with Stage(tmp_path) as st:
        upstream = st.serve(AsgiUpstream(st.ca.ca, ["api.test"], tmp_path, h2=True))
        st.token("old-token-0001", newline=False)
        (tmp_path / "secret").write_text("not-a-canary-h2-value\n")
        ph = "surr_RevokedHttp2Placeholder1"
        text = _rules(upstream.port, "token", held=[credential("k", ph, ["api.test"], "file:secret")])
        proxy = st.proxy(text, ["api.test"])
        from test_surfaces import _H2First  # httpx offers h2 second; mitmproxy takes the first

        verify = _H2First(ssl.PROTOCOL_TLS_CLIENT)
        verify.load_verify_locations(cafile=proxy.ca_pem)
        url = f"https://api.test:{upstream.port}"
        auth = {"Authorization": "Bearer surr_RevokedHttp2Placeholder1"}
        old = proxy.url("c", "old-token-0001")
        with httpx.Client(proxy=old, verify=verify, timeout=10, http2=True) as client:
            r = client.get(f"{url}/mux/0", headers=auth)
            assert (r.status_code, r.http_version) == (200, "HTTP/2")
            _replace(tmp_path / "token", "new-token-0000002")
            results: list[object] = []

            def send(i: int) -> None:
                try:
                    results.append(client.get(f"{url}/mux/{i}", headers=auth).status_code)
                except httpx.HTTPError as e:
                    results.append(type(e).__name__)

            threads = [threading.Thread(target=send, args=(i,)) for i in range(1, 9)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert len(results) == 8 and 200 not in results, results
        assert [s.target for s in upstream.seen if s.target.startswith("/mux")] == ["/mux/0"]


# -- hostile review (r5): requests sent without a CONNECT --------------------------------------


def _stream_without_connect(proxy: ProxyProcess, upstream: Upstream, claim: str, token: str) -> socket.socket:
    """An absolute-form ``GET https://api.test/sse`` on the explicit listener (no CONNECT): the
    response's head and first event have arrived, the rest waits for ``sse_release``."""
    upstream.sse_release.clear()
    auth = base64.b64encode(f"{claim}:{token}".encode()).decode()
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(
        f"GET https://api.test:{upstream.port}/sse HTTP/1.1\r\nHost: api.test:{upstream.port}\r\n"
        f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    data = b""
    while b"data: one" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return sock


def _ends_unfinished(sock: socket.socket, upstream: Upstream) -> None:
    """The proxy closes ``sock`` within 3 s, before the stream's second event."""
    sock.settimeout(3)
    rest = b""
    try:
        while chunk := sock.recv(65536):  # the proxy closes it: recv returns b""
            rest += chunk
    except TimeoutError:
        pytest.fail("the revoked claim's stream was still open 3 s after the revocation")
    except ConnectionError:
        pass
    finally:
        upstream.sse_release.set()
        sock.close()
    assert b"data: two" not in rest


@pytest.mark.parametrize("change", ["token-file-rewritten", "claim-reloaded-away"])
def test_a_stream_sent_without_connect_ends_when_its_claim_is_revoked(setup: Setup, change: str) -> None:
    """Was: an absolute-form request's streaming response (SSE here; a download or a WebSocket
    alike) went on after its claim's token was rotated or the claim removed, while a tunnel's
    is closed by the poll: only the next request on the connection was refused."""
    sock = _stream_without_connect(setup.proxy, setup.upstream, "c", "old-token-0001")
    if change == "token-file-rewritten":
        _replace(setup.tmp / "token", "new-token-0000002")
    else:
        _replace(setup.rules, _rules(setup.upstream.port, "token", with_claim=False))
        assert wait_reload(setup.proxy, 1)[0]["outcome"] == "applied"
    _ends_unfinished(sock, setup.upstream)


def test_a_stream_sent_without_connect_ends_when_its_store_claim_is_deleted(tmp_path: Path) -> None:
    """The same for a control-API claim deleted while its absolute-form stream runs."""
    from test_control import control_world

    with control_world(tmp_path) as world:
        try:
            with world.api() as api:
                token = api.post("/v1/claims", json={"id": "sd", "pool": "p"}).json()["proxy_token"]
                sock = _stream_without_connect(world.proxy, world.upstream, "sd", token)
                assert api.delete("/v1/claims/sd").status_code == 204
            _ends_unfinished(sock, world.upstream)
        finally:
            world.upstream.sse_release.set()


def test_one_connection_without_connect_serves_one_claim(tmp_path: Path) -> None:
    """Review r5: absolute-form requests of two claims on one client connection shared its pinned
    addresses and upstream connections, checked for the first claim only. The second claim's
    request is refused (407, naming why) and reaches no upstream; a connection of its own works."""
    from test_control import control_world

    with control_world(tmp_path) as world:
        with world.api() as api:
            made = {c: api.post("/v1/claims", json={"id": c, "pool": "p"}) for c in "ab"}
            tokens = {c: r.json()["proxy_token"] for c, r in made.items()}

        def request(sock: socket.socket, claim: str, path: str) -> bytes:
            auth = base64.b64encode(f"{claim}:{tokens[claim]}".encode()).decode()
            sock.sendall(
                f"GET https://api.test:{world.upstream.port}{path} HTTP/1.1\r\n"
                f"Host: api.test:{world.upstream.port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(65536)
                assert chunk, head
                head += chunk
            length = int(next(
                (v for k, v in (line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
                 if k.lower() == b"content-length"), b"0"))  # fmt: skip
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += sock.recv(65536)
            return head + body

        with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as sock:
            assert request(sock, "a", "/switch/a").startswith(b"HTTP/1.1 200")
            refused = request(sock, "b", "/switch/b")
            assert refused.startswith(b"HTTP/1.1 407") and b"one connection serves one claim" in refused
        with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as sock:
            assert request(sock, "b", "/switch/b-own").startswith(b"HTTP/1.1 200")
        paths = [r.path for r in world.upstream.requests if r.path.startswith("/switch")]
        assert paths == ["/switch/a", "/switch/b-own"]
