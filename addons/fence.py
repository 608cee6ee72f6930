"""fence: transparent connections that must not be served, whatever their source says.

- **Loops** (issue 20 item 7). When a redirect rule lacks the exclusion of the proxy's own
  traffic, each upstream connection the proxy opens comes straight back to its transparent
  listener, and — when the sandbox and the proxy share an address — from a claim's address: it
  would be allowed, open the next, and so on until a limit. The local end (address, port) of every
  upstream connection is kept while it is open; a transparent connection whose source is one of
  them — or, from another worker, a connecting socket of the proxy's user in the kernel's table
  (:mod:`proxy.engine.sockets`) — is the proxy talking to itself and is refused once (403
  ``own_listener``), whatever the addresses, before anything is sent on. A looped TLS connection
  is never passed through.
- **Interface binding** (issue 21). A claim with ``interface: IF`` accepts only connections that
  arrived on IF. mitmproxy does not know a connection's arrival interface, so the kernel says it:
  the printed rules (``surrogate transparent-rules``) mark a sandbox's packets with
  :func:`proxy.core.netrules.interface_mark` of the interface (or bridge port) they arrived on, and with
  ``net.ipv4.tcp_fwmark_accept=1`` an accepted socket carries the mark of its SYN. A connection
  whose mark is not its claim's interface's (no mark included) is refused (403
  ``wrong_interface``) and audited: a sandbox that took another's address on a shared bridge gets
  nothing of the other claim's. The anti-spoof rules the same command prints keep such packets
  out in the first place; this check holds when they are missing.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

from mitmproxy import connection, ctx, http, tls
from mitmproxy.proxy import mode_specs, server_hooks

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.core.netrules import interface_mark
from proxy.engine import sockets
from proxy.engine.hostaddrs import is_own_address


def _key(address: Any) -> tuple[str, int] | None:
    """(canonical IP, port) of a socket address; IPv4-mapped IPv6 as IPv4."""
    if not address:
        return None
    try:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(address[1])


class Fence:
    def __init__(self) -> None:
        self.upstream_ends: dict[tuple[str, int], int] = {}  # local end -> open connections
        self._marks: dict[str, int | None] = {}  # client id -> its socket's mark
        self._looped: dict[str, bool] = {}  # client id -> decided at its first request

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        end = _key(data.server.sockname)
        if end is not None:
            self.upstream_ends[end] = self.upstream_ends.get(end, 0) + 1

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        end = _key(data.server.sockname)
        if end is not None and end in self.upstream_ends:
            self.upstream_ends[end] -= 1
            if not self.upstream_ends[end]:
                del self.upstream_ends[end]

    def client_disconnected(self, client: connection.Client) -> None:
        self._marks.pop(client.id, None)
        self._looped.pop(client.id, None)

    def _loops(self, client: connection.Client) -> bool:
        # the looping upstream connection was registered before it sent a byte, so the answer at
        # a connection's first request (or ClientHello) holds for its life
        if client.id not in self._looped:
            self._looped[client.id] = self._looping(client)
        return self._looped[client.id]

    def _looping(self, client: connection.Client) -> bool:
        end = _key(client.peername)
        if end is None:
            return False
        if end in self.upstream_ends:
            return True
        # another worker's upstream connection (--workers N): the kernel's socket table knows it;
        # asked only for a source on this host, so a sandbox elsewhere costs nothing
        return is_own_address(ipaddress.ip_address(end[0])) and sockets.held_by(end, os.getuid())

    def _wrong_interface(self, client: connection.Client, claim: Any) -> bool:
        if claim is None or claim.interface is None:
            return False
        return self._mark(client) != interface_mark(claim.interface)

    def _mark(self, client: connection.Client) -> int | None:
        if client.id not in self._marks:
            mark = None
            handler = ctx.master.addons.get("proxyserver").connections.get(client.id)
            io = handler.transports.get(client) if handler is not None else None
            sock = io.writer.get_extra_info("socket") if io is not None and io.writer else None
            if sock is not None:
                try:
                    # an int, signed: the top bit of the mark makes it negative
                    mark = sock.getsockopt(socket.SOL_SOCKET, socket.SO_MARK) & 0xFFFFFFFF
                except OSError:
                    mark = None
            self._marks[client.id] = mark
        return self._marks[client.id]

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not facts.is_transparent(flow):
            return
        client = flow.client_conn
        if self._loops(client):  # before any earlier refusal's reason: this is what it is
            facts.refuse(
                flow,
                deny(
                    Reason.OWN_LISTENER,
                    "this connection is one of surrogate's own upstream connections redirected back "
                    "to it (a loop: the redirect rule lacks the exclusion of the proxy's traffic)",
                ),
            )
            return
        if flow.response or flow.error:
            return
        claim: Any = flow.metadata.get(facts.CLAIM)
        if self._wrong_interface(client, claim):
            facts.refuse(
                flow,
                deny(
                    Reason.WRONG_INTERFACE,
                    f"source address {client.peername[0]} belongs to claim {claim.id}, whose "
                    f"connections must arrive on interface {claim.interface}; this one did not",
                ),
            )

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """A looped or wrongly arrived TLS connection is never passed through: it is intercepted,
        and its first request refused (after policy, which may have chosen pass-through)."""
        client = data.context.client
        if not data.ignore_connection or not isinstance(client.proxy_mode, mode_specs.TransparentMode):
            return
        try:
            passing = facts.PASSTHROUGH.get(client.id)
            refuse = self._loops(client) or self._wrong_interface(client, passing.claim if passing else None)
        except Exception as e:  # fail closed: intercept
            facts.log.error("fence.tls_clienthello failed with %s", type(e).__name__)
            refuse = True
        if refuse:
            data.ignore_connection = False
            facts.PASSTHROUGH.pop(client.id, None)
