"""resolve: pinned names (``surrogate run --resolve NAME:ADDR``, like curl's ``--resolve``).

When the upstream's canonical name is pinned, the connection goes to the pinned address while
the TLS SNI and certificate verification keep using the name. Names that are not pinned are
resolved by the system resolver when mitmproxy connects.
"""

from __future__ import annotations

from mitmproxy.proxy import server_hooks

from proxy.errors import HostError
from proxy.hosts import canonical_host
from proxy.state import State


class Resolve:
    def __init__(self, state: State) -> None:
        self.state = state

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if not self.state.pins or server.address is None:
            return
        name, port = server.address
        try:
            pinned = self.state.pins.get(canonical_host(name))
        except HostError:
            server.error = "invalid upstream host name"  # fail closed: no connection
            return
        if pinned is not None:
            if server.tls and not server.sni:
                server.sni = name
            server.address = (pinned, port)
