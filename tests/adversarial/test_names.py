"""Name tricks: case, trailing dot, IDNA spellings, wildcard apex and label boundaries, malformed
ports. One canonical host form (proxy/core/hosts.py ``canonical_host``, ``split_authority``) is used by
policy, credential binding and audit alike, so a different spelling of a host is the same host,
and a look-alike host is a different one.
"""

from __future__ import annotations

import base64

import pytest
from harness import World, status_line

WIDE_PH = "surr_HostileWidePlaceholder002"  # claim "wide": bound to *.wild.test and bücher.test


def _get(world: World, connect_host: str, host_header: str, path: str, claim: str, ph: str) -> bytes:
    port = world.upstream.port
    head = (
        f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\n"
        f"Authorization: Bearer {ph}\r\nConnection: close\r\n\r\n"
    ).encode()
    return world.tunnel_request(head, host=connect_host, claim=claim)


def _sent_auth(world: World, path: str) -> list[str]:
    return [
        v
        for r in world.upstream.requests
        if r.path == path
        for k, v in r.headers
        if k.lower() == "authorization"
    ]


SAME_HOST = [
    ("api.test", "API.Test", "host-header-case"),
    ("api.test", "api.test.", "host-header-trailing-dot"),
    ("API.TEST.", "api.test", "connect-case-and-trailing-dot"),
]


@pytest.mark.parametrize(("connect", "header"), [r[:2] for r in SAME_HOST], ids=[r[2] for r in SAME_HOST])
def test_another_spelling_of_a_bound_host_is_the_same_host(world: World, connect: str, header: str) -> None:
    path = f"/v1/same-{connect}-{header}"
    data = _get(world, connect, header, path, "agent", world.placeholder)
    assert status_line(data) == b"200", data[:300]
    assert _sent_auth(world, path) == [f"Bearer {world.secret}"]
    assert world.proxy.wait_event(path=path)["host"] == "api.test"


IDNA = [("xn--bcher-kva.test", "a-label"), ("XN--BCHER-KVA.TEST.", "a-label-upper-trailing-dot")]


@pytest.mark.parametrize("host", [h for h, _ in IDNA], ids=[i for _, i in IDNA])
def test_idna_spellings_of_a_bound_host_match_its_unicode_rule(world: World, host: str) -> None:
    path = f"/idna-{len(host)}"
    data = _get(world, host, host, path, "wide", WIDE_PH)
    assert status_line(data) == b"200", data[:300]
    assert _sent_auth(world, path) == [f"Bearer {world.secret}"]
    assert world.proxy.wait_event(path=path)["host"] == "xn--bcher-kva.test"


def test_a_wildcard_binding_matches_a_subdomain(world: World) -> None:
    data = _get(world, "a.wild.test", "a.wild.test", "/wild-sub", "wide", WIDE_PH)
    assert status_line(data) == b"200", data[:300]
    assert _sent_auth(world, "/wild-sub") == [f"Bearer {world.secret}"]


@pytest.mark.parametrize("host", ["wild.test", "badwild.test"], ids=["bare-apex", "not-at-label-boundary"])
def test_a_wildcard_binding_never_matches_the_apex_or_a_look_alike(world: World, host: str) -> None:
    """``*.wild.test`` binds the credential: the pool's ``*`` rule lets the request through, but the
    placeholder toward ``wild.test`` or ``badwild.test`` is a violation, refused before connecting."""
    before = world.upstream.connections
    path = f"/wild-{host}"
    data = _get(world, host, host, path, "wide", WIDE_PH)
    assert status_line(data) == b"403" and b"placeholder_violation" in data, data[:300]
    assert world.paths(path) == [] and world.upstream.connections == before


@pytest.mark.parametrize(
    "port",
    ["²", "1" * 5000, "-1", "65536", "0x50"],
    ids=["superscript-two", "5000-digits", "negative", "too-big", "hex"],
)
def test_a_malformed_host_port_is_refused_not_waved_through(world: World, port: str) -> None:
    """Was: Host 'api.test:²' made int() raise inside the policy hook; mitmproxy logged it and let
    the request through, skipping every rule and still swapping the secret."""
    done = world.curl(
        "--http1.1",
        "-X",
        "DELETE",
        "-H",
        f"Host: api.test:{port}",
        "-H",
        f"Authorization: Bearer {world.placeholder}",
        world.url(f"/admin/{port[:3]}"),
    )
    assert int(done.stdout.rsplit(b"\n", 1)[-1]) in (400, 421), done
    assert world.paths("/admin") == []


def test_a_host_header_disagreeing_with_the_tunnel_is_refused(world: World) -> None:
    """CONNECT api.test, then Host: other.test inside: the placeholder must not follow the Host."""
    before = world.upstream.connections
    data = _get(world, "other.test", "api.test", "/v1/mismatch", "agent", world.placeholder)
    assert status_line(data) in (b"421", b"403"), data[:300]
    assert world.paths("/v1/mismatch") == [] and world.upstream.connections == before


def test_basic_credentials_spelled_for_a_look_alike_host_are_a_violation(world: World) -> None:
    basic = base64.b64encode(f"x:{WIDE_PH}".encode()).decode()
    port = world.upstream.port
    head = (
        f"GET /lookalike HTTP/1.1\r\nHost: badwild.test:{port}\r\n"
        f"Authorization: Basic {basic}\r\nConnection: close\r\n\r\n"
    ).encode()
    data = world.tunnel_request(head, host="badwild.test", claim="wide")
    assert status_line(data) == b"403" and b"placeholder_violation" in data
    assert world.paths("/lookalike") == []
