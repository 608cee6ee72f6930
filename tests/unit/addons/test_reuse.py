"""addons/reuse.py: mitmproxy reuses an upstream connection only for the name it was opened for
(and, over TLS, its SNI), never for another name on the same pinned address."""

from __future__ import annotations

import pytest
from mitmproxy.connection import Server
from mitmproxy.proxy.layers.http import GetHttpConnection

from addons import reuse

IP = "127.0.0.1"


def opened(name: str, port: int, tls: bool, sni: str | None = None) -> Server:
    """A connection mitmproxy opened for ``name`` that resolve then pinned to IP."""
    server = Server(address=(name, port), transport_protocol="tcp")
    server.tls = tls
    server.sni = sni if sni is not None else (name if tls else None)
    reuse.opened_for(server, (name, port))
    server.address = (IP, port)
    return server


CASES = [
    ("api.test", True, opened("api.test", 443, True), True, "same-name-tls"),
    ("other.test", True, opened("api.test", 443, True), False, "other-name-same-address-tls"),
    (IP, True, opened("api.test", 443, True), False, "ip-literal-on-a-named-connection"),
    ("api.test", True, opened("api.test", 443, True, sni="other.test"), False, "sni-not-the-name"),
    ("api.test", False, opened("api.test", 443, True), False, "plain-request-on-tls-connection"),
    ("api.test", False, opened("api.test", 443, False), True, "same-name-plain"),
    ("other.test", False, opened("api.test", 443, False), False, "other-name-same-address-plain"),
]


@pytest.mark.parametrize(
    ("name", "tls", "server", "expected"), [c[:4] for c in CASES], ids=[c[4] for c in CASES]
)
def test_a_connection_matches_only_requests_for_its_own_name(
    name: str, tls: bool, server: Server, expected: bool
) -> None:
    reuse.install()
    event = GetHttpConnection((name, 443), tls, None)
    assert event.connection_spec_matches(server) is expected


def test_install_is_idempotent_and_replaces_mitmproxys_address_match() -> None:
    reuse.install()
    reuse.install()
    assert GetHttpConnection.connection_spec_matches is reuse._matches
