"""The authority a request names, and the one the upstream acts on (review r-h2auth).

A hostile sandbox spells a request's destination several ways: an HTTP/1 absolute-form target
with or without a Host header, an HTTP/2 ``:authority`` with or without a ``host`` field beside
it, in upper case, with a trailing dot, without the tunnel's port, with userinfo, twice. Policy
decides on one canonical authority (``addons/policy.py`` ``_decide``); the upstream must receive
exactly that one, spelled canonically, in its own Host field (RFC 9112 §3.2.2: a proxy replaces
the Host of an absolute-form request with the target's authority), or the request is refused
before anything leaves.

Was: ``GET https://api.test:PORT/v1/x HTTP/1.1`` without a Host header, inside a tunnel to
api.test: policy rewrote the target
to origin form and the upstream received the request, the secret swapped in, with no Host at
all — the upstream (a shared address, a CDN, a reverse proxy with several virtual hosts) chose
the host itself. (The explicit proxy's plain ``http://`` form without Host was refused already.)
"""

from __future__ import annotations

import socket
import ssl

import h2.config
import h2.connection
import h2.events
import pytest
from harness import World, status_line
from world import Stage


def _hosts(world: World, path: str) -> list[list[str]]:
    """For each request the upstream received at ``path``: its Host field values."""
    got = [r for r in world.upstream.requests if r.path == path]
    return [[v for k, v in r.headers if k.lower() == "host"] for r in got]


def _secret_reached(world: World, path: str) -> bool:
    return any(world.secret in v for r in world.upstream.requests if r.path == path for _, v in r.headers)


# -- HTTP/1 absolute form: without a Host header, or one without the port ----------------------

ABSOLUTE_NO_HOST = [
    ("HTTP/1.1", "https://api.test:{port}/v1/abs-nohost-11", "api.test:{port}", "http11"),
    ("HTTP/1.1", "https://API.Test.:{port}/v1/abs-nohost-spelled", "api.test:{port}", "http11-spelled"),
    ("HTTP/1.0", "https://api.test:{port}/v1/abs-nohost-10", "api.test:{port}", "http10"),
    ("HTTP/1.1", "https://api.test:{port}/v1/abs-host-no-port", "api.test:{port}", "host-without-port"),
]


@pytest.mark.parametrize(
    ("version", "target", "host"), [r[:3] for r in ABSOLUTE_NO_HOST], ids=[r[3] for r in ABSOLUTE_NO_HOST]
)
def test_an_absolute_form_request_reaches_the_upstream_with_its_target_as_host(
    world: World, version: str, target: str, host: str
) -> None:
    port = world.upstream.port
    target, host = target.format(port=port), host.format(port=port)
    path = "/" + target.split("/", 3)[3]
    sent = "Host: api.test\r\n" if "no-port" in target else ""  # the target's port replaces it
    auth = f"Authorization: Bearer {world.placeholder}\r\n"
    head = f"GET {target} {version}\r\n{sent}{auth}Connection: close\r\n\r\n"
    data = world.tunnel_request(head.encode(), host="api.test")
    assert status_line(data) == b"200", data[:300]
    assert _hosts(world, path) == [[host]]
    assert _secret_reached(world, path)


def test_a_plain_absolute_form_request_without_host_is_refused_before_anything_is_sent(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The explicit proxy's cleartext request (absolute form by definition, RFC 9112 §3.2.2)
    without a Host header: mitmproxy keeps no target authority for it, so it names no host
    policy could check it against: 421, nothing sent (held)."""
    with Stage(tmp_path_factory.mktemp("plain-nohost")) as st:
        plain = st.upstream(["plain.test"], tls=False)
        head = (
            f"GET http://PLAIN.test:{plain.port}/abs-nohost-plain HTTP/1.1\r\n"
            f"Proxy-Authorization: {world.proxy_auth('wide')}\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=15) as s:
            s.sendall(head.encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        world.received.append(data)
        assert status_line(data) == b"421" and b"authority_mismatch" in data, data.decode("latin-1")
        assert plain.requests == [] and plain.connections == 0


# -- HTTP/2 authority spellings ------------------------------------------------------------------


def _h2(world: World, connect: str, headers: list[tuple[bytes, bytes]]) -> tuple[bytes | None, str]:
    """One HTTP/2 request with exactly ``headers`` (no client-side checks) in a tunnel to
    ``connect``: (status or None, what happened: the body, or how the stream ended)."""
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config)
    with world.tls_tunnel(connect, timeout=10, alpn="h2") as tls:
        conn.initiate_connection()
        conn.send_headers(1, headers, end_stream=True)
        tls.sendall(conn.data_to_send())
        status, body = None, b""
        while True:
            try:
                data = tls.recv(65536)
            except (ConnectionError, ssl.SSLError, TimeoutError):
                return status, "connection error"
            if not data:
                return status, "closed"
            world.received.append(data)
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    status = dict(ev.headers)[b":status"]
                elif isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                    conn.acknowledge_received_data(ev.flow_controlled_length, 1)
                elif isinstance(ev, h2.events.StreamEnded):
                    return status, body.decode("utf-8", "replace")
                elif isinstance(ev, h2.events.StreamReset | h2.events.ConnectionTerminated):
                    return status, "reset"
            tls.sendall(conn.data_to_send())


# (name fields beside :method/:scheme/:path, the Host the upstream must get or None: refused)
H2_NAMES: list[tuple[list[tuple[str, str]], str | None, str]] = [
    ([(":authority", "API.TEST:{port}")], "api.test:{port}", "authority-upper-case"),
    ([(":authority", "api.test.:{port}")], "api.test:{port}", "authority-trailing-dot"),
    ([("host", "Api.Test.:{port}")], "api.test:{port}", "host-field-only-spelled"),
    (
        [(":authority", "API.TEST.:{port}"), ("host", "API.TEST.:{port}")],
        "api.test:{port}",
        "host-same-bytes-spelled",
    ),
    ([(":authority", "api.test:443")], None, "authority-another-port"),
    ([(":authority", "a@api.test:{port}")], None, "authority-userinfo"),
    ([(":authority", "api.test:{port}"), ("host", "API.TEST:{port}")], None, "host-beside-authority-case"),
    ([(":authority", "api.test:{port}"), ("host", "api.test")], None, "host-beside-authority-no-port"),
    ([(":authority", "api.test:{port}"), ("host", "evil.test:{port}")], None, "host-beside-authority-other"),
    ([(":authority", "api.test:{port}"), (":authority", "evil.test:{port}")], None, "authority-twice"),
    ([(":authority", "surr_HostileTestPlaceholder001.api.test:{port}")], None, "authority-placeholder"),
    ([], None, "no-name-at-all"),
]


@pytest.mark.parametrize(("names", "host"), [r[:2] for r in H2_NAMES], ids=[r[2] for r in H2_NAMES])
def test_an_http2_request_reaches_the_upstream_under_the_one_canonical_authority(
    world: World, names: list[tuple[str, str]], host: str | None
) -> None:
    """Each spelling either reaches the upstream under the tunnel's canonical host (and the
    audit names that host), or is refused with nothing sent."""
    port = world.upstream.port
    path = f"/v1/h2-name-{len(world.upstream.requests)}-{abs(hash(str(names))) % 10**8}"
    fields = [(k.encode(), v.format(port=port).encode()) for k, v in names]
    pseudo = [kv for kv in fields if kv[0].startswith(b":")]
    rest = [kv for kv in fields if not kv[0].startswith(b":")]
    headers = [(b":method", b"GET"), (b":scheme", b"https"), *pseudo, (b":path", path.encode()), *rest]
    headers.append((b"authorization", f"Bearer {world.placeholder}".encode()))
    status, what = _h2(world, "api.test", headers)
    if host is None:
        assert status != b"200" and _hosts(world, path) == [], (status, what)
        return
    assert status == b"200", what
    assert _hosts(world, path) == [[host.format(port=port)]]
    assert _secret_reached(world, path)
    assert world.proxy.wait_event(path=path)["host"] == "api.test"


# -- HTTP/2 pseudo-header tricks -----------------------------------------------------------------


def _get(path: bytes, *more: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"GET"), (b":scheme", b"https"), (b":path", path), *more]


H2_TRICKS: list[tuple[list[tuple[bytes, bytes]], str]] = [
    (_get(b"/v1/t-a", (b":path", b"/v1/t-b")), "path-twice"),
    ([(b":method", b"CONNECT"), (b":authority", b"evil.test:{port}")], "connect-another-host"),
    ([(b":method", b"CONNECT"), (b":authority", b"api.test:{port}")], "connect-same-host"),
    ([(b":method", b"CONNECT"), *_get(b"/v1/t-ws")[1:], (b":protocol", b"websocket")], "extended-connect"),
    (_get(b"v1/t-noslash"), "path-without-slash"),
    (_get(b""), "path-empty"),
    (_get(b"/v1/t-order", (b"x", b"y"), (b":authority", b"api.test:{port}")), "pseudo-after-regular"),
    (_get(b"/v1/t-upper", (b"Authorization", b"Bearer PH")), "upper-case-field-name"),
    (_get(b"/v1/t-conn", (b"connection", b"keep-alive")), "connection-specific-field"),
]


@pytest.mark.parametrize("headers", [r[0] for r in H2_TRICKS], ids=[r[1] for r in H2_TRICKS])
def test_http2_pseudo_header_tricks_are_refused_before_anything_is_sent(
    world: World, headers: list[tuple[bytes, bytes]]
) -> None:
    port = str(world.upstream.port).encode()
    fields = [(k, v.replace(b"{port}", port).replace(b"PH", world.placeholder.encode())) for k, v in headers]
    if not any(k == b":authority" for k, _ in fields):
        fields.insert(2, (b":authority", b"api.test:" + port))
    before = len(world.upstream.requests)
    status, what = _h2(world, "api.test", fields)
    assert status != b"200", what
    assert len(world.upstream.requests) == before
    assert not [r for r in world.upstream.requests if "/v1/t-" in r.path]


def test_http2_scheme_http_inside_tls_still_goes_over_tls_under_the_tunnels_host(world: World) -> None:
    """``:scheme http`` on a stream inside the TLS tunnel: mitmproxy takes the scheme from the
    connection (TLS), so the request is the tunnel's ``https`` request; it reaches the upstream
    over TLS (the upstream speaks nothing else) under the canonical host."""
    port = world.upstream.port
    headers = [
        (b":method", b"GET"), (b":scheme", b"http"), (b":authority", f"api.test:{port}".encode()),
        (b":path", b"/v1/h2-scheme-http"), (b"authorization", f"Bearer {world.placeholder}".encode()),
    ]  # fmt: skip
    status, what = _h2(world, "api.test", headers)
    assert status == b"200", what
    assert _hosts(world, "/v1/h2-scheme-http") == [[f"api.test:{port}"]]


@pytest.mark.parametrize(
    ("connect", "bound"), [("api.test", True), ("other.test", False)], ids=["bound", "unbound"]
)
def test_a_placeholder_in_a_header_block_split_over_continuation_frames_is_seen(
    world: World, connect: str, bound: bool
) -> None:
    """A header block larger than one frame (16 KiB) goes as HEADERS + CONTINUATION; the
    placeholder straddles the frame boundary. Toward its bound host it is swapped, toward another
    host it is a violation, as in one frame."""
    port = world.upstream.port
    path = f"/v1/h2-continuation-{connect}"
    pad = "p" * (16384 - 40)
    headers = [
        (b":method", b"GET"), (b":scheme", b"https"), (b":authority", f"{connect}:{port}".encode()),
        (b":path", path.encode()), (b"authorization", f"Bearer {pad} {world.placeholder} {pad}".encode()),
    ]  # fmt: skip
    status, what = _h2(world, connect, headers)
    if bound:
        assert status == b"200", what
        got = [
            v for r in world.upstream.requests if r.path == path for k, v in r.headers if k == "authorization"
        ]
        assert got == [f"Bearer {pad} {world.secret} {pad}"]
    else:
        assert status == b"403" and "placeholder_violation" in what, (status, what)
        assert _hosts(world, path) == []
