"""identify: which claim is this connection?

Transparent mode: the claim is the one whose ``sources`` hold the connection's source address
(longest prefix wins); an unknown source is refused (403 ``unknown_source``) and audited. A
transparent connection belongs to the claim its source identified when it opened (its id, origin
and, for a store claim, generation): once the source identifies another claim or none (the claim
deleted, its sources changed, a rules reload), the poll closes the connection, long-lived streams
and TLS pass-through included, and a request still on it is refused (``unknown_source``).

Explicit mode: the sandbox sends ``Proxy-Authorization: Basic base64(<claim id>:<token>)``
(RFC 9110 §11.7.1, RFC 7617) on its CONNECT, or on each plain-HTTP request. The token is
compared in constant time with the claim's proxy token; a missing or wrong one gets 407 with
``Proxy-Authenticate: Basic``. A CONNECT authenticates its whole tunnel: the claim and the
canonical CONNECT target are remembered per client connection and copied into every flow in it.

Every ``Proxy-*`` header is removed before anything is forwarded, so the proxy credential never
reaches an upstream.

Run-time claims come from the store: the index is refreshed at the start of every CONNECT and
request, and polled every ``POLL_SECONDS`` so that a deleted claim (or a rotated proxy token)
closes that claim's open tunnels even when they are idle.

Revocation is the same for rules-file claims (issue 13): their token comes from a ``file:`` or
``env:`` source (re-read when the file changes) or changes with a rules reload. A tunnel keeps
the token that opened it; every request in it checks that token again against the claim as it
is now, and is refused (407) once it no longer matches or the claim is gone; the poll closes
such tunnels too, idle ones included.

A store claim's tunnel belongs to the claim as it was when its CONNECT authenticated (its
version and creation time, :meth:`proxy.store.registry.Registry.generation`): a token rotated while
the CONNECT was being answered, or the id deleted and created again for another tenant within
one poll, is another claim, refused on the next request and closed by the poll.

A client connection that sends its requests without a CONNECT (absolute-form ``http://`` or
``https://``, each request authenticated on its own) is watched the same way (review r5): it
belongs to the claim and token of its latest authenticated request, and the poll closes it once
those no longer hold, so that a response still streaming (SSE, a long download, a WebSocket)
ends with its claim, as inside a tunnel; before, only the next request was refused.

Fleet store staleness (issue 14, :mod:`proxy.store.freshness`), decided: while the node's copy of
the store is past its bound (``stale``) or was never read (``never_synced``), every request and
CONNECT of a *store* claim is refused (503 ``store_stale`` / ``store_never_synced``, with
``Retry-After: 1``), credentialed or not: the claim, its token and its credentials are all store
data the node cannot know current (a claim may have been deleted for abuse). A request naming
a claim the node does not know (explicit mode) or from a source no claim holds (transparent)
gets the same answer instead of 407 / ``unknown_source``, since the claim may exist in the store.
The poll closes store claims' open tunnels and streams once the node is stale. Rules-file claims
are served as ever: their rules, tokens and ``file:``/``env:`` values are local (budgets they
count in the store still fail closed, ``credential_budget_spent``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass, field

from mitmproxy import connection, ctx, http
from mitmproxy.proxy import mode_specs

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host
from proxy.core.policy import Claim
from proxy.engine.state import State
from proxy.store.freshness import NEVER_SYNCED


@dataclass(frozen=True, slots=True)
class _Tunnel:
    claim_id: str
    authority: tuple[str, int]
    token: str = field(default="", repr=False, compare=False)  # the proxy token that opened it
    origin: str = "rules"  # the claim's origin then: a claim of that id from elsewhere is another
    generation: tuple[int, float] | None = None  # a store claim's, when the CONNECT authenticated


def _still_valid(claim: Claim | None, tunnel: _Tunnel, generation: tuple[int, float] | None) -> bool:
    """A tunnel may go on carrying requests: its claim exists with the same origin and, for a
    rules-file claim, still takes the token the tunnel was opened with; for a store claim, is
    the very claim (``generation``: the registry's now) that authenticated the CONNECT. A store
    claim rotated or deleted and created again under the same id while the CONNECT was being
    answered, or between two polls, is another claim."""
    if claim is None or claim.origin != tunnel.origin:
        return False
    if claim.origin == "store":
        return tunnel.generation is not None and generation == tunnel.generation
    return claim.proxy_token.matches(tunnel.token)


def _credentials(value: str) -> tuple[str, str] | None:
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


POLL_SECONDS = 0.2

# A transparent connection's claim as identified by its source: id, origin, store generation.
SourceClaim = tuple[str, str, tuple[int, float] | None] | None


class Identify:
    def __init__(self, state: State) -> None:
        self.state = state
        self.tunnels: dict[str, _Tunnel] = {}
        # client id -> the claim and token of its latest request sent without a CONNECT
        self.direct: dict[str, _Tunnel] = {}
        # client id -> the token of its CONNECT and the store claim's generation, until connected
        self._tokens: dict[str, tuple[str, tuple[int, float] | None]] = {}
        # client id -> (source address, its claim when the transparent connection opened)
        self.sources: dict[str, tuple[str, SourceClaim]] = {}
        self._poller: asyncio.Task[None] | None = None

    def running(self) -> None:
        self._poller = asyncio.create_task(self._poll())

    def done(self) -> None:
        if self._poller is not None:
            self._poller.cancel()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                self._refresh()
                self._close(self._revoked_tunnels() | self._revoked_sources())
            except Exception as e:  # keep polling; every request in a tunnel is checked anyway
                facts.log.error("revocation poll failed with %s", type(e).__name__)

    def _refresh(self) -> None:
        revoked = self.state.registry.refresh()
        if revoked:
            watched = [*self.tunnels.items(), *self.direct.items()]
            self._close({c for c, t in watched if t.claim_id in revoked})

    def _stale_refusal(self, flow: http.HTTPFlow, claim: Claim | None, named: str | None) -> bool:
        """Refuse ``flow`` (True) when the store copy is stale or never synced and the request
        is a store claim's, or names (``named``) a claim this node does not know."""
        state = self.state.registry.stale()
        if state is None:
            return False
        if claim is not None and claim.origin != "store":
            return False
        if claim is None and (named is None or named in self.state.policy.claims):
            return False
        if state == NEVER_SYNCED:
            reason = Reason.STORE_NEVER_SYNCED
            why = "this proxy node has not read the credential store since it started: store claims unknown"
        else:
            reason = Reason.STORE_STALE
            why = "this proxy node cannot read the credential store and its copy is past the staleness bound"
        decision = deny(reason, f"{why} (retry later)", status=503)
        facts.refuse(flow, decision, {"Retry-After": "1"})
        return True

    def _revoked_tunnels(self) -> set[str]:
        """Client ids of tunnels that may no longer carry requests (:func:`_still_valid`; each
        claim and token checked once per poll); every store claim's while the store is stale."""
        checked: dict[tuple[str, str, tuple[int, float] | None], bool] = {}
        out = set()
        registry = self.state.registry
        stale = registry.stale() is not None
        for client_id, tunnel in [*self.tunnels.items(), *self.direct.items()]:
            if stale and tunnel.origin == "store":
                out.add(client_id)
                continue
            key = (tunnel.claim_id, tunnel.token, tunnel.generation)
            if key not in checked:
                claim = registry.claim(tunnel.claim_id)
                checked[key] = _still_valid(claim, tunnel, registry.generation(tunnel.claim_id))
            if not checked[key]:
                out.add(client_id)
        return out

    def _source_claim(self, address: str) -> SourceClaim:
        claim = self.state.registry.claim_for_source(address)
        if claim is None:
            return None
        generation = self.state.registry.generation(claim.id) if claim.origin == "store" else None
        return (claim.id, claim.origin, generation)

    def _revoked_sources(self) -> set[str]:
        """Client ids of transparent connections whose source no longer identifies the claim it
        identified when they opened."""
        now: dict[str, SourceClaim] = {}
        out = set()
        stale = self.state.registry.stale() is not None
        for client_id, (address, then) in list(self.sources.items()):
            if stale and then is not None and then[1] == "store":
                out.add(client_id)
                continue
            if address not in now:
                now[address] = self._source_claim(address)
            if now[address] != then:
                out.add(client_id)
        return out

    def client_connected(self, client: connection.Client) -> None:
        if isinstance(client.proxy_mode, mode_specs.TransparentMode) and client.peername:
            address = str(client.peername[0])
            self.sources[client.id] = (address, self._source_claim(address))

    def _close(self, client_ids: set[str]) -> None:
        if not client_ids:
            return
        server = ctx.master.addons.get("proxyserver")
        for handler in list(server.connections.values()):
            if handler.client.id in client_ids:
                self.tunnels.pop(handler.client.id, None)
                self.direct.pop(handler.client.id, None)
                self.sources.pop(handler.client.id, None)
                handler.close_connection(handler.client)

    def _authenticate(self, flow: http.HTTPFlow) -> Claim | None:
        creds = _credentials(flow.request.headers.get("Proxy-Authorization", ""))
        claim = self.state.registry.claim(creds[0]) if creds else None
        if creds is None or claim is None or not claim.proxy_token.matches(creds[1]):
            return None
        generation = self.state.registry.generation(claim.id)
        earlier = self.direct.get(flow.client_conn.id)
        if earlier is not None and (earlier.claim_id, earlier.origin) != (claim.id, claim.origin):
            # One client connection serves one claim: its pinned addresses and its upstream
            # connections were checked for the first one (review r5).
            flow.metadata[facts.CLAIM_SWITCH] = earlier.claim_id
            return None
        if flow.request.method == "CONNECT":
            self._tokens[flow.client_conn.id] = (creds[1], generation)
        else:  # a request without a tunnel: its connection is watched until the next one
            self.direct[flow.client_conn.id] = _Tunnel(claim.id, ("", 0), creds[1], claim.origin, generation)
        return claim

    def _refuse_auth(self, flow: http.HTTPFlow) -> None:
        if (earlier := flow.metadata.get(facts.CLAIM_SWITCH)) is not None:
            message = (
                f"this connection already carries requests of claim {earlier!r}: one connection "
                "serves one claim, open a new connection for another"
            )
            facts.refuse(flow, deny(Reason.PROXY_AUTH_REQUIRED, message, status=407))
            return
        facts.refuse(
            flow,
            deny(
                Reason.PROXY_AUTH_REQUIRED,
                "proxy authentication required: send Proxy-Authorization: Basic <claim>:<token>",
                status=407,
            ),
            {"Proxy-Authenticate": 'Basic realm="surrogate"'},
        )

    @facts.fail_closed
    def http_connect(self, flow: http.HTTPFlow) -> None:
        flow.metadata[facts.REQUEST_ID] = flow.id
        self._refresh()
        claim = self._authenticate(flow)
        named = _named(flow)
        _strip_proxy_headers(flow)
        if self._stale_refusal(flow, claim, named):
            return
        if claim is None:
            self._refuse_auth(flow)
            return
        flow.metadata[facts.CLAIM] = claim
        try:
            host = canonical_host(flow.request.host)
        except HostError as e:
            facts.refuse(flow, deny(Reason.NO_RULE, str(e), status=400))
            return
        flow.request.host = host
        flow.metadata[facts.AUTHORITY] = (host, flow.request.port)

    def http_connected(self, flow: http.HTTPFlow) -> None:
        # Only a CONNECT that was allowed opens a tunnel whose requests inherit its claim.
        claim = flow.metadata[facts.CLAIM]
        token, generation = self._tokens.pop(flow.client_conn.id, ("", None))
        self.tunnels[flow.client_conn.id] = _Tunnel(
            claim.id, flow.metadata[facts.AUTHORITY], token, claim.origin, generation
        )

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        flow.metadata[facts.REQUEST_ID] = flow.id
        self._refresh()
        if facts.is_transparent(flow):
            _strip_proxy_headers(flow)
            # the layer set the request's host and port to the connection's original destination
            flow.metadata[facts.ORIGINAL_DST] = (flow.request.host, flow.request.port)
            peer = flow.client_conn.peername
            claim = self.state.registry.claim_for_source(peer[0]) if peer else None
            if self._stale_refusal(flow, claim, "" if claim is None else None):
                return
            if claim is None:
                who = peer[0] if peer else "unknown"
                facts.refuse(flow, deny(Reason.UNKNOWN_SOURCE, f"source address {who} belongs to no claim"))
                return
            opened = self.sources.get(flow.client_conn.id)
            if opened is not None and self._source_claim(opened[0]) != opened[1]:
                facts.refuse(
                    flow,
                    deny(
                        Reason.UNKNOWN_SOURCE,
                        f"source address {opened[0]} no longer identifies the claim this connection "
                        "was opened for (deleted, changed or replaced): open a new connection",
                    ),
                )
                return
            flow.metadata[facts.CLAIM] = claim
            return
        tunnel = self.tunnels.get(flow.client_conn.id)
        named = None
        if tunnel is not None:
            claim = self.state.registry.claim(tunnel.claim_id)
            if not _still_valid(claim, tunnel, self.state.registry.generation(tunnel.claim_id)):
                claim = None  # revoked: the token that opened this tunnel no longer opens it
            flow.metadata[facts.AUTHORITY] = tunnel.authority
        else:
            claim = self._authenticate(flow)
            named = _named(flow)
        _strip_proxy_headers(flow)
        if self._stale_refusal(flow, claim, named):
            return
        if claim is None:
            self._refuse_auth(flow)
            return
        flow.metadata[facts.CLAIM] = claim

    def claim_of(self, client_id: str) -> tuple[str, str, tuple[int, float] | None] | None:
        """The claim a client connection serves (id, origin, store generation) as recorded when
        it authenticated, or None before that or for none: the identity the upstream TLS sessions
        of its connections are kept under (addons/upstreamtls.py)."""
        if (tunnel := self.tunnels.get(client_id) or self.direct.get(client_id)) is not None:
            return (tunnel.claim_id, tunnel.origin, tunnel.generation)
        if (source := self.sources.get(client_id)) is not None:
            return source[1]
        return None

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.pop(client.id, None)
        self.direct.pop(client.id, None)
        self.sources.pop(client.id, None)
        self._tokens.pop(client.id, None)


def _named(flow: http.HTTPFlow) -> str | None:
    """The claim id the request's Proxy-Authorization names, if it names one."""
    creds = _credentials(flow.request.headers.get("Proxy-Authorization", ""))
    return creds[0] if creds else None


def _strip_proxy_headers(flow: http.HTTPFlow) -> None:
    # On the raw fields: going through Headers decodes every name, on every request.
    fields = flow.request.headers.fields
    if any(n[:6].lower() == b"proxy-" for n, _ in fields):
        flow.request.headers.fields = tuple((n, v) for n, v in fields if n[:6].lower() != b"proxy-")
