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

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time

import h2.config
import h2.connection
import h2.events
import jsonschema
import pytest
from harness import ROOT, World, status_line
from world import Stage


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
    ("first", "tag"),
    [("other.test", "name"), ("OTHER.test.", "spelling")],
    ids=["other-name", "other-spelling"],
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


# -- the request target names the upstream the request is decided for --------------------------

# (request target, Host header): inside a CONNECT tunnel to api.test; each names another
# authority somewhere, so the request must be refused (421), never sent to api.test with the secret
OTHER_TARGETS = [
    ("https://evil.test:{port}/v1/t-abs-other", "api.test:{port}", "absolute-uri-other-host"),
    ("https://evil.test/v1/t-abs-noport", "api.test:{port}", "absolute-uri-other-host-default-port"),
    ("https://api.test:1/v1/t-abs-port", "api.test:{port}", "absolute-uri-other-port"),
    ("http://evil.test:{port}/v1/t-abs-http", "api.test:{port}", "absolute-uri-http-other-host"),
    ("https://evil.test:{port}/v1/t-abs-both", "evil.test:{port}", "absolute-uri-and-host-other"),
    ("https://api.test:{port}/v1/t-abs-hostonly", "evil.test:{port}", "host-header-other"),
]


@pytest.mark.parametrize(
    ("target", "host"), [r[:2] for r in OTHER_TARGETS], ids=[r[2] for r in OTHER_TARGETS]
)
def test_an_absolute_uri_naming_another_authority_inside_a_tunnel_is_refused(
    world: World, target: str, host: str
) -> None:
    """Was: GET https://evil.test/x inside a tunnel to api.test (Host: api.test) was sent to
    api.test, request line and all, with the secret."""
    port = world.upstream.port
    target, host = target.format(port=port), host.format(port=port)
    path = "/" + target.split("/", 3)[3]
    head = (
        f"GET {target} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="api.test")
    assert status_line(data) == b"421" and b"authority_mismatch" in data, data[:300]
    assert world.paths(path) == [] and not any(target in r.path for r in world.upstream.requests)


def test_an_absolute_uri_naming_the_tunnel_host_is_sent_in_origin_form(world: World) -> None:
    """The same authority spelled in absolute form is the same request: the upstream gets the
    origin form (one reading), over a session for api.test."""
    port = world.upstream.port
    head = (
        f"GET https://API.test:{port}/v1/t-abs-same HTTP/1.1\r\nHost: api.test:{port}\r\n"
        f"Authorization: Bearer {world.placeholder}\r\nConnection: close\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="api.test")
    assert status_line(data) == b"200", data[:300]
    assert world.paths("/v1/t-abs-same") == ["/v1/t-abs-same"]
    assert _sessions_of(world, "/v1/t-abs-same") == ["api.test"]
    _secret_went_over_own_sessions(world)


@pytest.mark.parametrize("target", ["evil.test:{port}", "api.test:{port}"], ids=["other-host", "same-host"])
def test_a_connect_inside_a_tunnel_is_refused(world: World, target: str) -> None:
    """Was: a CONNECT sent inside an intercepted tunnel was authenticated again, replaced the
    tunnel's recorded authority, and mitmproxy forwarded it to the upstream as a proxy CONNECT."""
    target = target.format(port=world.upstream.port)
    before = len(world.upstream.sessions)
    head = (
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {world.proxy_auth()}\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="api.test")
    assert status_line(data) == b"400", data[:300]
    assert len(world.upstream.sessions) == before and not any(
        r.method == "CONNECT" for r in world.upstream.requests
    )


def test_explicit_absolute_form_with_a_host_header_naming_another_host_is_refused(world: World) -> None:
    """No CONNECT: the absolute URI says api.test, the Host header other.test."""
    port, auth = world.upstream.port, world.proxy_auth()
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
        status, body = _exchange(
            s,
            f"GET https://api.test:{port}/v1/x-host-other HTTP/1.1\r\nHost: other.test:{port}\r\n"
            f"Authorization: Bearer {world.placeholder}\r\nProxy-Authorization: {auth}\r\n\r\n",
        )
    world.received.append(body)
    assert status == 421 and b"authority_mismatch" in body
    assert world.paths("/v1/x-host-other") == []


def _h2_request(world: World, connect: str, headers: list[tuple[str, str]]) -> tuple[str, bytes]:
    """One HTTP/2 request with exactly ``headers`` (pseudo-headers first; no client-side
    validation) inside a CONNECT tunnel to ``connect``: (":status", body); the status is
    "reset" when the proxy reset the stream or ended the connection instead (h2's own header
    validation refuses a Host header that disagrees with :authority that way)."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, header_encoding="utf-8"
    )
    conn = h2.connection.H2Connection(config)
    with world.tls_tunnel(connect, timeout=15, alpn="h2") as tls:
        conn.initiate_connection()
        conn.send_headers(1, headers, end_stream=True)
        tls.sendall(conn.data_to_send())
        status, body = "", b""
        while True:
            data = tls.recv(65536)
            if not data:
                break
            ended = False
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[":status"]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    status, ended = status or "reset", True
            tls.sendall(conn.data_to_send())
            if ended:
                break
    world.received.append(body)
    return status, body


def _h2_get(authority: str, path: str, placeholder: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", authority),
        (":path", path),
        ("authorization", f"Bearer {placeholder}"),
        *extra,
    ]


H2_CASES = [
    ("other.test", "api.test", (), "authority-other-than-connect"),  # connection coalescing
    ("api.test", "other.test", (), "authority-bound-host-in-other-tunnel"),
    ("other.test", "other.test", (("host", "api.test:{port}"),), "host-header-other-than-authority"),
    ("api.test", "api.test", (("host", "evil.test:{port}"),), "host-header-other-on-bound-host"),
]


@pytest.mark.parametrize(
    ("connect", "authority", "extra"), [r[:3] for r in H2_CASES], ids=[r[3] for r in H2_CASES]
)
def test_an_http2_stream_naming_another_host_than_its_tunnel_is_refused(
    world: World, connect: str, authority: str, extra: tuple[tuple[str, str], ...]
) -> None:
    """HTTP/2 on the sandbox side: one h2 connection (SNI and CONNECT for one name) may carry a
    stream whose :authority (or a Host header beside it) names another host. Each is refused,
    and nothing reaches the upstream."""
    port = world.upstream.port
    path = f"/v1/h2-{connect}-{authority}-{len(extra)}"
    headers = _h2_get(f"{authority}:{port}", path, world.placeholder)
    headers += [(k, v.format(port=port)) for k, v in extra]
    status, body = _h2_request(world, connect, headers)
    assert status in ("421", "reset") and (status == "reset" or b"authority_mismatch" in body), (status, body)
    assert world.paths(path) == []


def test_an_http2_stream_for_its_own_tunnel_host_goes_over_its_own_session(world: World) -> None:
    port = world.upstream.port
    status, _ = _h2_request(world, "api.test", _h2_get(f"api.test:{port}", "/v1/h2-own", world.placeholder))
    assert status == "200"
    assert _sessions_of(world, "/v1/h2-own") == ["api.test"]
    _secret_went_over_own_sessions(world)


# -- bytes inside an intercepted tunnel that are not HTTP ---------------------------------------

NOT_HTTP = [
    (b"SSH-2.0-OpenSSH_9.6\r\n", "ssh-banner"),
    (b"PING\r\n", "redis-inline-ping"),
    (b"*1\r\n$4\r\nPING\r\n", "redis-resp-ping"),
    (b"EHLO sandbox\r\n", "smtp-ehlo"),
    (b"\x00\x01binary", "binary"),
]


def _tunnel_raw(world: World, payload: list[bytes], tls: bool, host: str = "api.test") -> bytes:
    """CONNECT to ``host``, optionally TLS, then send each of ``payload`` 0.2 s apart; what came
    back before the proxy closed."""
    port = world.upstream.port
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        sock: socket.socket = raw
        if tls:
            ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
            sock = ctx.wrap_socket(raw, server_hostname=host)
        data = b""
        try:
            for i, part in enumerate(payload):
                if i:
                    threading.Event().wait(0.2)
                sock.sendall(part)
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionError, ssl.SSLError, TimeoutError):
            pass
        finally:
            sock.close()
    world.received.append(data)
    return data


@pytest.mark.parametrize("tls", [False, True], ids=["in-tunnel", "inside-tls"])
@pytest.mark.parametrize("payload", [r[0] for r in NOT_HTTP], ids=[r[1] for r in NOT_HTTP])
def test_bytes_that_are_not_http_in_an_intercepted_tunnel_are_refused_and_audited(
    world: World, payload: bytes, tls: bool
) -> None:
    """Was: CONNECT api.test, then an SSH banner or a Redis PING (with or without TLS around
    it): mitmproxy fell back to a raw TCP layer and relayed the bytes to the upstream."""
    before_conns, before_events = world.upstream.connections, len(world.proxy.audit_events())
    data = _tunnel_raw(world, [payload], tls)
    assert data == b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [e for e in world.proxy.audit_events()[before_events:] if e["reason"] == "not_http"]
        if found:
            break
        time.sleep(0.05)
    assert [(e["event"], e["claim"], e["host"], e["decision"]) for e in found] == [
        ("tunnel", "agent", "api.test", "deny")
    ]
    jsonschema.validate(found[0], json.loads((ROOT / "docs" / "audit-schema.json").read_text()))
    assert world.upstream.connections == before_conns  # the upstream saw nothing at all


def test_a_request_line_split_over_reads_is_still_http(world: World) -> None:
    """The decision waits for the request line to end: "GE" then the rest is one request."""
    port = world.upstream.port
    rest = f"T /v1/split-line HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n".encode()
    data = _tunnel_raw(world, [b"GE", rest], tls=True)
    assert status_line(data) == b"200", data[:200]
    assert world.paths("/v1/split-line") == ["/v1/split-line"]


@pytest.mark.parametrize("split", [1, 2], ids=["first-byte", "first-two-bytes"])
def test_a_client_hello_split_over_reads_is_still_tls(world: World, split: int) -> None:
    """Was (review r5): CONNECT api.test, then a ClientHello whose first one or two bytes came
    in a read of their own: mitmproxy reads fewer than three bytes as not TLS, so the tunnel was
    closed as not_http. The decision now waits for the record header."""
    port = world.upstream.port
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        tls = ctx.wrap_bio(incoming, outgoing, server_hostname="api.test")
        hello_sent = False
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                data = outgoing.read()
                if not hello_sent:
                    raw.sendall(data[:split])
                    threading.Event().wait(0.3)
                    data, hello_sent = data[split:], True
                raw.sendall(data)
                got = raw.recv(65536)
                assert got, "the proxy closed the tunnel during the handshake"
                incoming.write(got)
        head = f"GET /v1/split-hello-{split} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
        tls.write(head.encode())
        raw.sendall(outgoing.read())
        data = b""
        while got := raw.recv(65536):
            incoming.write(got)
            try:
                while chunk := tls.read(65536):
                    data += chunk
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                pass
    world.received.append(data)
    assert status_line(data) == b"200", data[:200]
    assert _sessions_of(world, f"/v1/split-hello-{split}") == ["api.test"]


def _client_hello(name: str) -> bytes:
    """The bytes of a real TLS ClientHello for ``name``."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("split", [0, 1, 2], ids=["whole", "first-byte-apart", "two-bytes-apart"])
def test_tls_inside_the_tunnels_tls_is_refused_and_audited(world: World, split: int) -> None:
    """Review r5 (held): a second ClientHello inside the intercepted TLS, whole or split over
    reads, is never relayed (mitmproxy would take it for the start of TLS to pass on)."""
    before_conns, before_events = world.upstream.connections, len(world.proxy.audit_events())
    hello = _client_hello("other.test")
    data = _tunnel_raw(world, [hello[:split], hello[split:]] if split else [hello], tls=True)
    assert data == b""
    deadline, found = time.monotonic() + 5, []
    while not found and time.monotonic() < deadline:
        found = [e for e in world.proxy.audit_events()[before_events:] if e["reason"] == "not_http"]
        time.sleep(0.05)
    assert [(e["event"], e["host"]) for e in found] == [("tunnel", "api.test")], found
    assert split or "TLS inside the tunnel's TLS" in found[0]["message"]
    assert world.upstream.connections == before_conns


def test_a_short_non_http_start_is_not_relayed_while_waiting(world: World) -> None:
    """Two bytes are not enough to decide: nothing is relayed while waiting, and the rest of a
    Redis PING is refused."""
    before = world.upstream.connections
    data = _tunnel_raw(world, [b"PI", b"NG\r\n"], tls=False)
    assert data == b"" and world.upstream.connections == before


# -- scheme rules (plain.test: scheme http on any port; the others: https on the upstream's port) --


def _plain(world: World, head: str) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
        status, body = _exchange(s, head)
    world.received.append(body)
    return status, body


def test_a_port_allowed_for_plain_http_cannot_be_connected(world: World) -> None:
    """Was: plain.test (any port) was CONNECTable as a tunnel on every port."""
    before = world.upstream.connections
    status, body = _plain(
        world,
        f"CONNECT plain.test:8080 HTTP/1.1\r\nHost: plain.test:8080\r\n"
        f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n",
    )
    assert status == 403 and b"scheme_not_allowed" in body, body
    event = world.proxy.wait_event(event="tunnel", host="plain.test", port=8080)
    assert event["reason"] == "scheme_not_allowed" and world.upstream.connections == before


@pytest.mark.parametrize("host", ["api.test", "other.test"])
def test_plain_http_toward_a_tls_port_is_refused_before_any_connection(world: World, host: str) -> None:
    """Was: GET http://other.test:<its https port>/ was allowed and sent in cleartext."""
    port, before = world.upstream.port, world.upstream.connections
    status, body = _plain(
        world,
        f"GET http://{host}:{port}/v1/cleartext-to-tls HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Proxy-Authorization: {world.proxy_auth()}\r\nConnection: close\r\n\r\n",
    )
    assert status == 403 and b"scheme_not_allowed" in body, body
    assert world.upstream.connections == before


def test_plain_http_inside_a_tunnel_to_a_tls_port_is_refused(world: World) -> None:
    """CONNECT api.test (an https rule), then cleartext HTTP inside: the request is http."""
    port, before = world.upstream.port, world.upstream.connections
    head = f"GET /v1/cleartext-in-tunnel HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n"
    data = _tunnel_raw(world, [head.encode()], tls=False)
    assert status_line(data) == b"403" and b"scheme_not_allowed" in data, data[:300]
    assert world.upstream.connections == before


def test_an_upgrade_to_a_protocol_that_is_not_websocket_is_refused(world: World) -> None:
    """Was: an upstream's 101 to another protocol made mitmproxy relay both directions raw,
    past the scrubber: the upstream's reflection of the secret reached the sandbox."""
    port = world.upstream.port
    head = (
        f"GET /v1/upgrade-raw HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: Upgrade\r\n"
        f"Upgrade: raw-echo\r\nAuthorization: Bearer {world.placeholder}\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="api.test")
    assert b"101" not in data.split(b"\r\n", 1)[0] and world.secret.encode() not in data, data[:200]
    event = world.proxy.wait_event(path="/v1/upgrade-raw")
    assert (event["reason"], event["status"]) == ("not_http", None)


@pytest.mark.parametrize(
    "protocol", ["h2c", "TLS/1.2", "raw-echo", "websocket, h2c"], ids=["h2c", "tls", "other", "list"]
)
def test_an_upgrade_to_another_protocol_is_never_offered_upstream(world: World, protocol: str) -> None:
    """Was (review r5): ``Upgrade: h2c`` (``curl --http2 http://…``) and any other protocol were
    forwarded; an upstream that takes the upgrade answered 101, which tunnel.py refuses, so the
    request got a closed connection instead of its answer. Now the Upgrade (and HTTP2-Settings)
    is dropped and the upstream answers in HTTP/1.1."""
    port = world.upstream.port
    path = f"/v1/upgrade-asked-{protocol.split('/')[0].split(',')[0]}"
    head = (
        f"GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: Upgrade, HTTP2-Settings, close\r\n"
        f"Upgrade: {protocol}\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
        f"Authorization: Bearer {world.placeholder}\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="api.test")
    assert status_line(data) == b"200" and world.secret.encode() not in data, data[:200]
    [got] = [r for r in world.upstream.requests if r.path == path]
    assert not [k for k, _ in got.headers if k.lower() in ("upgrade", "http2-settings")], got.headers


def test_plain_http_requests_for_two_names_on_one_address_get_two_connections(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Cleartext sibling: absolute-form http:// for plain.test and evil.test (both pinned to
    127.0.0.1; claim ``wide`` allows plain http anywhere) on one client connection: one upstream
    connection per name, reused for the same name."""
    with Stage(tmp_path_factory.mktemp("plain-upstream")) as st:
        plain = st.upstream(["plain.test"], tls=False)
        auth = world.proxy_auth("wide")
        statuses = []
        with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
            for i, name in enumerate(["plain.test", "evil.test", "plain.test", "evil.test"]):
                status, _ = _exchange(
                    s,
                    f"GET http://{name}:{plain.port}/two-names-{i} HTTP/1.1\r\nHost: {name}:{plain.port}\r\n"
                    f"Proxy-Authorization: {auth}\r\n\r\n",
                )
                statuses.append(status)
        assert statuses == [200] * 4
        hosts = [next(v for k, v in r.headers if k.lower() == "host") for r in plain.requests]
        assert [h.split(":")[0] for h in hosts] == ["plain.test", "evil.test", "plain.test", "evil.test"]
        assert plain.connections == 2
