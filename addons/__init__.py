"""surrogate's addon chain. The order of the chain is written here and nowhere else.

Each addon handles one concern and talks to the others only through ``flow.metadata`` (keys in
:mod:`addons.facts`). mitmproxy calls addons in list order for every hook, so:

1. identify   — who is this (claim), from Proxy-Authorization; strips Proxy-* headers
   limits     — the claim's open connections and request rate (429 before any other work), and
                the request-head deadline; right after identify because it needs the claim
   wslimit    — the pool's bound on one WebSocket message (1009 past it), before scrub sees one
   hygiene    — refuse ambiguous request heads (duplicate Host, control characters, oversize,
                TRACE toward credentials); drop hop-by-hop headers
2. policy     — egress rules decide; deny before any upstream TCP/TLS; authority agreement
   fence      — transparent mode: a looped connection (one of the proxy's own upstream
                connections, redirected back) and a claim's connection from the wrong interface
                are refused; after policy, so that it can undo a pass-through policy chose
   approve    — a request an ask rule (``approve:``) covers, with no grant, is held until an
                operator decides (issue 16); in requestheaders, before substitute, sign, stream and
                any upstream connection (lazy), so nothing has left and no secret is swapped in (a
                body declared ≤ 64 KiB: in request, once read, the later addons' requestheaders
                run after the decision: addons/approvebody.py)
   forgery    — a placeholder with surrogate's checksum that this claim does not hold: refused
   hooks      — a hook route's request is answered by an operator command (no upstream); it runs
                after policy (only allowed requests) and before substitute (it sees placeholders,
                never secrets), and before stream (its body is read whole, bounded)
   mint       — credentials of kind oauth_client: a fresh access token from the token endpoint
                (single flight), before substitute injects it (token_mint_failed when none)
   sigv4      — a request signed with an aws_sigv4 credential's placeholder keys: verified as
                the placeholder's, re-signed with the real key (head, and aws-chunked chunks);
                after hooks (a hook sees placeholders only)
3. substitute — placeholders → secrets, injections, violations
   sign       — credentials of kind hmac: the request signed (its body read whole, bounded),
                after substitute (it replaces substitute's body stream on such a request)
   refresh    — a request to a declared OAuth token endpoint holds the store's lease of that
                refresh (one node at a time); one that waited for another's is answered from
                the tokens it captured (no second call); after substitute, before stream
   scrub (messages) — WebSocket messages from the upstream, scrubbed before stream lets them go
4. stream     — forward every body read as it arrives (SSE), count bytes
   framing    — what mitmproxy's HTTP/1 writers cannot frame (trailers, a chunked 304): fixed
   oauth      — a token endpoint's response: real tokens into the store, placeholders onward; it
                reads the body as the upstream sent it (decoding it itself), so it comes before
                scrub, whose stream wraps it and scrubs what it passes on
   scrub      — secrets → placeholders in responses, on the stream stream set up
5. resolve    — pinned names → addresses, before mitmproxy's own loop check
6. audit      — one JSON event per flow, after every decision above is known
7. metrics    — Prometheus counters from the same facts

then only the mitmproxy addons interception needs: proxyserver (listeners, loop check),
next_layer (protocol detection; runs after policy's opaque-tunnel choice; addons/tunnel.py's
subclass: only TLS and HTTP in an intercepted tunnel), tlsconfig (our CA,
upstream verification), errorcheck (exit non-zero on a startup error).
"""

from __future__ import annotations

from typing import Any

from mitmproxy import tls
from mitmproxy.addons import errorcheck, proxyserver, tlsconfig
from mitmproxy.proxy import server_hooks

from addons import tlsbuffers
from addons.approve import Approve
from addons.audit import Audit
from addons.fence import Fence
from addons.forgery import Forgery
from addons.h1read import Framing
from addons.hooks import Hooks
from addons.hygiene import Hygiene
from addons.identify import Identify
from addons.limits import Limiter
from addons.metrics import Metrics
from addons.mint import Mint
from addons.oauth import OAuthCapture
from addons.policy import Policy
from addons.refresh import RefreshLease
from addons.resolve import Resolve
from addons.scrub import Scrub, ScrubMessages
from addons.sign import Sign
from addons.sigv4 import SigV4
from addons.stream import Stream
from addons.substitute import Substitute
from addons.tunnel import NextLayer
from addons.upstreamtls import UpstreamSessions
from addons.wslimit import WebSocketLimit
from proxy.engine.state import State


class TlsConfig(tlsconfig.TlsConfig):
    """mitmproxy's tlsconfig without its ``request`` hook. That hook answers, on any host, a
    request for ``/mitmproxy-<CA serial>.crl`` with the CA's empty CRL (for leaf certificates
    that name it as their CRL distribution point: only when the upstream certificate is known
    at the handshake, never with the lazy upstream connections surrogate uses), and reads two
    options per request: about 12 µs of every request, measured (issue 7). Such a request goes
    to the upstream like any other. Every TLS connection it starts frees its record buffers
    while idle (addons/tlsbuffers.py). Given ``sessions``, an upstream connection resumes a
    session of an earlier verified one of the same claim, name, address and settings
    (addons/upstreamtls.py)."""

    request = None  # type: ignore[assignment]

    def __init__(self, sessions: UpstreamSessions | None = None) -> None:
        super().__init__()
        self.sessions = sessions

    def tls_start_client(self, tls_start: tls.TlsData) -> None:
        super().tls_start_client(tls_start)
        tlsbuffers.release_when_idle(tls_start)

    def tls_start_server(self, tls_start: tls.TlsData) -> None:
        super().tls_start_server(tls_start)
        tlsbuffers.release_when_idle(tls_start)
        if self.sessions is not None:
            self.sessions.offer(tls_start)

    def tls_failed_server(self, tls_start: tls.TlsData) -> None:
        if self.sessions is not None:
            self.sessions.forget(tls_start.conn.id)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        if self.sessions is not None:
            self.sessions.closed(data.server)


def chain(state: State) -> list[Any]:
    """The full, ordered addon list for a proxy serving ``state``."""
    policy = Policy(state)
    identify = Identify(state)
    return [
        identify,
        Limiter(state),
        WebSocketLimit(state),
        Hygiene(),
        policy,
        Fence(),
        Approve(state, policy),
        Forgery(),
        Hooks(state),
        Mint(state),
        SigV4(state),
        Substitute(state),
        Sign(state),
        RefreshLease(state),
        ScrubMessages(state),
        Stream(),
        Framing(),
        OAuthCapture(state),
        Scrub(state),
        Resolve(state),
        Audit(),
        Metrics(state),
        proxyserver.Proxyserver(),
        NextLayer(state),  # mitmproxy's, refusing non-HTTP bytes in intercepted tunnels
        TlsConfig(UpstreamSessions(identify.claim_of, lambda: state.policy)),
        errorcheck.ErrorCheck(repeat_errors_on_stderr=True),
    ]
