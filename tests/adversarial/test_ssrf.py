"""SSRF and rebinding: no spelling of a special-purpose address gets the proxy to connect to it.

The ``wide`` claim may go to every host and port, so what refuses these requests is the resolver
(addons/resolve.py with proxy/core/addresses.py): every address a destination resolves to is checked
against the special-purpose table, in whatever spelling the sandbox wrote it, before any upstream
connection. A real upstream listens on 127.0.0.1: a request that got through would reach it.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from harness import World, status_line
from world import Stage, claim, credential, egress, rules

# (spelling as sent, what it is) — every one of them is 127.0.0.1 or another loopback form
LOOPBACK = [
    ("127.0.0.1", "dotted-quad"),
    ("127.1", "short-form"),
    ("127.0.1", "three-part-short-form"),
    ("2130706433", "decimal"),
    ("0x7f000001", "hex"),
    ("0x7F.0.0.1", "hex-first-part"),
    ("0177.0.0.1", "octal-first-part"),
    ("017700000001", "octal"),
    ("127.000.000.001", "zero-padded"),
    ("0", "zero-means-this-host"),
    ("0.0.0.0", "unspecified"),
    ("localhost", "localhost"),
    ("LOCALHOST.", "localhost-upper-trailing-dot"),
    ("[::1]", "ipv6-loopback"),
    ("[0:0:0:0:0:0:0:1]", "ipv6-loopback-long"),
    ("[::ffff:127.0.0.1]", "ipv4-mapped"),
    ("[::ffff:7f00:1]", "ipv4-mapped-hex"),
    ("[::127.0.0.1]", "ipv4-compatible"),
    ("[64:ff9b::7f00:1]", "nat64"),
    ("[2002:7f00:1::1]", "6to4"),
    ("[2001:0:4136:e378:8000:63bf:80ff:fffe]", "teredo"),
]

# cloud metadata endpoints and other special-purpose ranges, in several spellings
SPECIAL = [
    ("169.254.169.254", "metadata"),
    ("2852039166", "metadata-decimal"),
    ("0xa9fea9fe", "metadata-hex"),
    ("169.254.43518", "metadata-short-form"),
    ("[::ffff:169.254.169.254]", "metadata-ipv4-mapped"),
    ("[64:ff9b::a9fe:a9fe]", "metadata-nat64"),
    ("[fd00:ec2::254]", "aws-ipv6-metadata"),
    ("169.254.170.2", "aws-ecs-metadata"),
    ("100.100.100.200", "alibaba-metadata"),
    ("168.63.129.16", "azure-wireserver"),
    ("10.0.0.1", "rfc1918-10"),
    ("172.16.0.1", "rfc1918-172"),
    ("192.168.0.1", "rfc1918-192"),
    ("100.64.0.1", "cgnat"),
    ("[fe80::1]", "ipv6-link-local"),
    ("[fd12:3456::1]", "unique-local"),
    ("224.0.0.1", "multicast"),
    ("192.0.2.1", "documentation"),
]


def plain_request(world: World, host: str, port: int) -> bytes:
    """An absolute-form plain-HTTP request, the host spelled exactly as given."""
    authority = f"{host}:{port}"
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(
            f"GET http://{authority}/ssrf HTTP/1.1\r\nHost: {authority}\r\n"
            f"Proxy-Authorization: {world.proxy_auth('wide')}\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    world.received.append(data)
    return data


def tunnelled_request(world: World, host: str, port: int) -> bytes:
    """CONNECT to the spelled host (intercepted: pool w), then GET inside the TLS tunnel."""
    authority = f"{host}:{port}"
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
            f"Proxy-Authorization: {world.proxy_auth('wide')}\r\n\r\n".encode()
        )
        first = raw.recv(4096)
        if not first.startswith(b"HTTP/1.1 200"):
            world.received.append(first)
            return first
        # verified against the proxy's CA; the name is not checked, as the spellings under test
        # (2130706433, 0x7f.1) are no DNS names a certificate could carry
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        ctx.check_hostname = False
        with ctx.wrap_socket(raw) as tls:
            tls.sendall(f"GET /ssrf HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    world.received.append(data)
    return data


def _refused_before_connecting(world: World, send, host: str) -> bytes:  # type: ignore[no-untyped-def]
    before = world.upstream.connections
    data = send(world, host, world.upstream.port)
    assert status_line(data) == b"403", data[:300]
    assert b"special_address" in data or b"own_listener" in data, data[:600]
    assert world.upstream.connections == before, "the proxy connected to the special address"
    return data


@pytest.mark.parametrize("host", [h for h, _ in LOOPBACK], ids=[i for _, i in LOOPBACK])
def test_loopback_in_any_spelling_is_refused_in_plain_http(world: World, host: str) -> None:
    _refused_before_connecting(world, plain_request, host)


@pytest.mark.parametrize("host", [h for h, _ in LOOPBACK], ids=[i for _, i in LOOPBACK])
def test_loopback_in_any_spelling_is_refused_inside_a_tunnel(world: World, host: str) -> None:
    _refused_before_connecting(world, tunnelled_request, host)


@pytest.mark.parametrize("host", [h for h, _ in SPECIAL], ids=[i for _, i in SPECIAL])
def test_metadata_and_special_ranges_are_refused(world: World, host: str) -> None:
    data = _refused_before_connecting(world, plain_request, host)
    assert b"special_address" in data


def test_the_refusal_is_audited_with_the_canonical_address(world: World) -> None:
    plain_request(world, "0x7f000001", world.upstream.port)
    events = [e for e in world.proxy.audit_events() if e.get("reason") == "special_address"]
    assert events and all(e["decision"] == "deny" for e in events)
    assert "0x7f000001" not in {e["host"] for e in events}, "audit must name the canonical host"


@pytest.mark.parametrize("allow", [False, True], ids=["refused", "allowed-by-allow_cidrs"])
def test_a_name_resolving_to_a_special_address_is_refused_unless_allowed(tmp_path: Path, allow: bool) -> None:
    """DNS (here /etc/hosts: localhost) answers loopback for an allowed name: refused after
    resolution, before any connection, unless the pool lists the network in allow_cidrs."""
    with Stage(tmp_path) as st:
        st.token("t", newline=False)
        upstream = st.upstream(["localhost"])
        extra = {"allow_cidrs": ["127.0.0.0/8"]} if allow else {}
        proxy = st.proxy(rules([egress("localhost", upstream.port)], pool_extra=extra, claims=[claim("c")]))
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "-x",
                proxy.url("c", "t"),
                "--cacert",
                str(proxy.ca_pem),
                "-w",
                "\n%{http_code}",
                f"https://localhost:{upstream.port}/special",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    if allow:
        assert done.stdout.endswith("200"), done
    else:
        assert done.stdout.endswith("403") and "special_address" in done.stdout, done
        assert upstream.connections == 0


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
def test_a_request_with_a_body_refused_at_resolution_gets_its_answer(tmp_path: Path, http2: bool) -> None:
    """Regression: with a body, a refusal made after substitution had set up body streaming
    (claims with credentials) hung the connection ("Can't set a response and enable streaming at
    the same time") and mitmproxy's crash report printed the request body on stderr."""
    with Stage(tmp_path) as st:
        st.token("t", newline=False)
        st.secret("k", tag="ssrfbody", file="secret")
        upstream = st.upstream(["localhost"])
        text = rules(
            [egress("localhost", upstream.port)],
            claim_id="c",
            credentials=[credential("k", "surr_SsrfBodyPlaceholder00001", ["localhost"], "file:secret")],
        )
        proxy = st.proxy(text)
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "15", "--http2" if http2 else "--http1.1"]
            + ["-x", proxy.url("c", "t"), "--cacert", str(proxy.ca_pem), "-w", "\n%{http_code}"]
            + ["-d", "body-content-marker=surr_SsrfBodyPlaceholder00001"]
            + [f"https://localhost:{upstream.port}/special-body"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        stderr = proxy.stderr()
    assert done.stdout.endswith("403") and "special_address" in done.stdout, done
    assert upstream.connections == 0
    assert "crashed" not in stderr and "body-content-marker" not in stderr, stderr[-2000:]
