"""reuse: an upstream connection is reused only for the name it was opened for, never merely for
the same address (DESIGN.md invariant 10).

mitmproxy 12.3 picks a reusable upstream connection in ``HttpLayer.get_connection``
(``mitmproxy/proxy/layers/http/__init__.py``) with ``GetHttpConnection.connection_spec_matches``:
equal ``address``, ``tls``, ``via`` and transport. surrogate pins every destination to its checked
IP (addons/resolve.py), so by address alone two names on one IP (a CDN, or two pinned names)
would share a connection: a request for ``api.test`` carrying its secret went over the TLS session
opened, SNI and certificate checked, for ``other.test``.

So a request's host stays its canonical *name* (the new connection gets that name as its address
and SNI), resolve rewrites the address to the checked IP in ``server_connect`` and records the
name here (:func:`opened_for`), and :func:`install` replaces ``connection_spec_matches`` once per
process: a connection matches a request when the name (and port) it was opened for equals the
request's, its TLS SNI (for TLS) is that name, and ``tls``, ``via`` and transport agree as before.

This reaches into mitmproxy's protocol layer (the dependency is pinned below 12.4); the tests in
tests/adversarial/test_upstream_identity.py count upstream sessions and their SNI and fail if
the replaced method stops being used.
"""

from __future__ import annotations

import weakref
from typing import Any

from mitmproxy.connection import Server
from mitmproxy.proxy.layers.http import GetHttpConnection

_OPENED_FOR: weakref.WeakKeyDictionary[Server, tuple[str, int]] = weakref.WeakKeyDictionary()
_MARK = "_surrogate_by_name"


def opened_for(server: Server, address: tuple[str, int]) -> None:
    """Record that ``server`` was opened for ``address`` (name, port) before its address is
    rewritten to the checked IP."""
    _OPENED_FOR[server] = address


def _matches(self: GetHttpConnection, connection: Any) -> bool:
    if not isinstance(connection, Server):
        return False
    name = _OPENED_FOR.get(connection, connection.address)
    return (
        self.address == name
        and self.tls == connection.tls
        and (not self.tls or connection.sni == self.address[0])
        and self.via == connection.via
        and self.transport_protocol == connection.transport_protocol
    )


setattr(_matches, _MARK, True)


def install() -> None:
    """Match upstream connections by name (once per process; later calls do nothing)."""
    if not getattr(GetHttpConnection.connection_spec_matches, _MARK, False):
        GetHttpConnection.connection_spec_matches = _matches  # type: ignore[method-assign]
