"""resolve: resolve each destination once, refuse surrogate's own listeners, pin the address.

The name is resolved here (or taken from ``--resolve NAME:ADDR``, like curl's), every address is
checked, and the connection goes to the checked address while the TLS SNI and certificate
verification keep using the name: the address checked is the address connected to (no second
lookup an attacker's DNS could answer differently).

- An HTTP request (after policy and substitute): its destination is resolved and checked once
  per client connection and name; the request's host stays the canonical name, so the upstream
  connection mitmproxy opens for it has that name as its address and SNI. ``server_connect``
  then points that connection at the checked IP and records the name (addons/reuse.py), so the
  connection is reused only for the same name, never for another name on the same address.
- Any other upstream connection (an opaque tunnel) is resolved and pinned in ``server_connect``.

Refused, after resolution (so in any spelling: ``127.1``, ``0x7f000001``, ``[::ffff:127.0.0.1]``,
a name whose DNS answers loopback...):
- one of surrogate's own listening ports on a local address — loopback, unspecified, or any
  address of this host (:mod:`proxy.engine.hostaddrs`) — (403 ``own_listener``);
- any special-purpose address (:mod:`proxy.core.addresses`: private, loopback, link-local, CGNAT,
  metadata endpoints, embedded IPv4...) unless the pool lists it in ``allow_cidrs``
  (403 ``special_address``). Every resolved address must pass, not just the first. Addresses the
  operator pinned with ``--resolve`` are the operator's choice and are not checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket

from mitmproxy import connection, http, tls
from mitmproxy.proxy import mode_specs, server_hooks

from addons import facts, reuse
from proxy.core.addresses import Network, allowed_by, special
from proxy.core.decide import Decision, Reason, deny
from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host
from proxy.engine.hostaddrs import is_own_address
from proxy.engine.state import State

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _is_local(ip: IP) -> bool:
    return is_own_address(ip)  # loopback, unspecified, or any address of this host (issue 21)


class Resolve:
    def __init__(self, state: State) -> None:
        self.state = state
        self._pinned: dict[tuple[str, str, int], str] = {}  # (client id, name, port) -> checked IP
        self._sni: dict[tuple[str, str, int], str] = {}  # (client id, IP, port) -> name
        self._allow: dict[str, tuple[Network, ...]] = {}  # client id -> the pool's allow_cidrs
        reuse.install()  # the request keeps its name (below): connections must match by name

    async def _checked(
        self, name: str, port: int, prefer: str | None = None, allow: tuple[Network, ...] = ()
    ) -> tuple[str | None, str]:
        return await checked(self.state, name, port, prefer, allow)

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        try:
            name, port, client = flow.metadata[facts.HOST], flow.request.port, flow.client_conn.id
            ip = self._pinned.get((client, name, port))
            if ip is None:
                pool = self.state.policy.pools.get(flow.metadata[facts.CLAIM].pool)
                allow = pool.allow_cidrs if pool else ()
                ip, why = await self._checked(name, port, self._must_be(flow), allow)
                if ip is None:
                    facts.refuse(flow, _refusal(why, flow))
                    return
                self._pinned[client, name, port] = ip
            if flow.request.data.host != name:
                flow.request.data.host = name  # server_connect connects it to the checked ip
        except Exception as e:  # fail closed, as every surrogate hook
            facts.log.error("resolve failed with %s; request refused", type(e).__name__)
            facts.refuse(
                flow, deny(Reason.INTERNAL_ERROR, "surrogate could not process this request", status=400)
            )

    def _must_be(self, flow: http.HTTPFlow) -> str | None:
        """Transparent mode: the name must resolve to the address the sandbox connected to, unless
        the pool allows re-routing (then surrogate connects to the name's own address)."""
        original = flow.metadata.get(facts.ORIGINAL_DST)
        if original is None:
            return None
        pool = self.state.policy.pools.get(flow.metadata[facts.CLAIM].pool)
        return None if pool is not None and pool.allow_reroute else str(original[0])

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """Transparent pass-through (policy chose it): the SNI's name must resolve to the address
        the sandbox connected to (unless the pool allows re-routing); else intercept instead, so
        that the first request is refused with an explanation."""
        context = data.context
        if not data.ignore_connection or not isinstance(
            context.client.proxy_mode, mode_specs.TransparentMode
        ):
            return
        try:
            assert context.server.address is not None and context.client.peername is not None
            original, port = context.server.address
            name = canonical_host(data.client_hello.sni or "")
            claim = self.state.registry.claim_for_source(context.client.peername[0])
            pool = self.state.policy.pools.get(claim.pool) if claim else None
            prefer = None if pool is not None and pool.allow_reroute else str(original)
            allow = pool.allow_cidrs if pool else ()
            self._allow[context.client.id] = allow
            ip, _ = await self._checked(name, port, prefer, allow)
        except Exception as e:  # fail closed: intercept, and let the first request be refused
            facts.log.error("resolve.tls_clienthello failed with %s", type(e).__name__)
            ip = None
        if ip is None:
            data.ignore_connection = False
            return
        self._sni[context.client.id, ip, port] = name
        context.server.address = (ip, port)

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        server = data.server
        if server.address is None or server.error:
            return
        host, port = server.address[0], server.address[1]
        pinned = self._pinned.get((data.client.id, host, port))
        if pinned is not None:  # an HTTP request's destination (by name), already checked
            if server.tls:  # the checked name, not the client's spelling of it (transparent)
                server.sni = host
            reuse.opened_for(server, (host, port))
            server.address = (pinned, port)
            return
        name = self._sni.get((data.client.id, host, port))
        if name is not None:  # a transparent pass-through, already checked and pinned
            return
        try:
            canonical = canonical_host(host)
        except HostError:
            server.error = "invalid upstream host name"  # fail closed: no connection
            return
        ip, why = await self._checked(canonical, port, None, self._allow.get(data.client.id, ()))
        if ip is None:
            server.error = f"refused: {why}"
            return
        if server.tls and not server.sni and not _is_ip(canonical):
            server.sni = canonical
        server.address = (ip, port)

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        """An opaque tunnel's destination is checked here, so that a CONNECT to one of the
        proxy's own listeners or a special address is answered 403 (not 200 and a closed
        tunnel); ``server_connect`` checks the address again when the tunnel opens."""
        claim = flow.metadata.get(facts.CLAIM)
        pool = self.state.policy.pools.get(claim.pool) if claim else None
        allow = pool.allow_cidrs if pool is not None else ()
        if pool is not None:  # the opaque tunnel's upstream connection has no flow: keep these
            self._allow[flow.client_conn.id] = allow
        if flow.response or flow.error or not flow.metadata.get(facts.OPAQUE):
            return
        try:
            host, port = flow.metadata[facts.AUTHORITY]
            ip, why = await self._checked(host, port, None, allow)
            refusal = None if ip is not None else _refusal(why, flow)
        except Exception as e:  # fail closed, as every surrogate hook
            facts.log.error("resolve.http_connect failed with %s; CONNECT refused", type(e).__name__)
            refusal = deny(Reason.INTERNAL_ERROR, "surrogate could not process this request", status=400)
        if refusal is not None:
            flow.metadata[facts.OPAQUE] = False
            facts.refuse(flow, dataclasses.replace(refusal, rule=flow.metadata[facts.DECISION].rule))

    def client_disconnected(self, client: connection.Client) -> None:
        self._allow.pop(client.id, None)
        for table in (self._pinned, self._sni):
            for key in [k for k in table if k[0] == client.id]:
                del table[key]


async def checked(
    state: State, name: str, port: int, prefer: str | None = None, allow: tuple[Network, ...] = ()
) -> tuple[str | None, str]:
    """(checked IP, "") or (None, why not), for a connection to ``name``:``port``; also the
    token requests of addons/mint.py, so they take the same path as any upstream request.
    ``prefer``: the address to use when it is one of the name's addresses (transparent mode:
    where the sandbox connected); ``allow``: special
    networks the pool may reach."""
    pinned = state.pins.get(name)
    if pinned is not None:
        addresses = [pinned]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            return None, f"cannot resolve {name}: {getattr(e, 'strerror', None) or type(e).__name__}"
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    ips = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
    if not ips:
        return None, f"cannot resolve {name}: no address"
    if port in state.own_ports and any(_is_local(ip) for ip in ips):
        return None, f"{name}:{port} is one of surrogate's own listeners"
    if pinned is None:
        for ip in ips:
            why = special(ip)
            if why is not None and not allowed_by(ip, allow):
                return (
                    None,
                    f"special: {name} resolves to {ip}, {why}; the pool's allow_cidrs does not allow it",
                )
    if prefer is not None:
        if ipaddress.ip_address(prefer) in ips:
            return prefer, ""
        return None, f"not an address of {name}"
    return str(ips[0]), ""


def _refusal(why: str, flow: http.HTTPFlow) -> Decision:
    if "own listeners" in why:
        return deny(Reason.OWN_LISTENER, why)
    if why.startswith("special: "):
        return deny(Reason.SPECIAL_ADDRESS, why.removeprefix("special: "))
    if why.startswith("not an address of"):
        original = flow.metadata[facts.ORIGINAL_DST][0]
        return deny(
            Reason.AUTHORITY_MISMATCH,
            f"the connection's destination {original} is {why} (the pool does not allow re-routing)",
            status=421,
        )
    return deny(Reason.UNRESOLVABLE, why, status=502)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
