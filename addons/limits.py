"""limits: per-claim connection and rate limits, and the request-head deadline (slowloris).

Thin glue over :mod:`proxy.core.limits`; the counts and buckets are the node's (every worker's:
:mod:`proxy.store.counters`). Runs right after identify (the claim must be known, and
nothing else should spend work on a request that is over its claim's limits):

- A CONNECT, or the first request of a plain-HTTP connection, that would put its claim over the
  pool's ``limits.connections`` is answered ``429 too_many_connections`` with ``Connection:
  close``, before any upstream connection (audited like every refusal).
- A transparent connection's claim is known from its source address when it is accepted, so it
  counts from then: one over the limit is closed before a byte is read (a warning, and
  ``surrogate_limit_refusals_total{limit="connections"}``; no request exists, so no audit
  event). Before (review r3) it counted from its first request: a sandbox held ten connections
  that sent nothing past a limit of two, each until the header timeout.
- A CONNECT or request over the claim's rate gets ``429 rate_limited`` with ``Retry-After``.
- A transparent pass-through (an opaque rule, chosen at the ClientHello) has neither a CONNECT
  nor a request: it is counted, and takes its token, when its upstream connection is about to
  open; over either limit that connection is refused (the client's connection closes) and the
  tunnel is audited with ``too_many_connections`` or ``rate_limited``. Before (review r3) pass-
  through connections were never counted: five were held open past a limit of two.
- A client connection waiting longer than ``header_timeout`` seconds for a complete request head
  is closed (a warning on stderr; counted in ``surrogate_limit_refusals_total{limit=
  "header_timeout"}``): no request exists yet, so there is no audit event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import addonmanager, connection, ctx, http
from mitmproxy.proxy import mode_specs, server_hooks

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.core.limits import ClaimLimiter, HeadDeadlines, Limits, retry_after
from proxy.engine.state import State

DEFAULT_HEADER_TIMEOUT = 60
# the server errors a pass-through over its claim's limits gets (audit maps them to reasons)
REFUSED_CONNECTIONS = "refused: too many connections"
REFUSED_RATE = "refused: rate limited"
log = logging.getLogger("surrogate")
_ENDED = "surrogate.limits.ended"


class Limiter:
    def __init__(self, state: State) -> None:
        self.state = state
        self.claims = ClaimLimiter(state.counters)
        self.heads = HeadDeadlines()
        self._sweeper: asyncio.Task[None] | None = None

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            "surrogate_header_timeout",
            int,
            DEFAULT_HEADER_TIMEOUT,
            "Seconds a client connection may wait for a complete request head before it is closed.",
        )

    def running(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    def done(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def _sweep(self) -> None:
        while True:
            timeout = ctx.options.surrogate_header_timeout
            await asyncio.sleep(min(1.0, timeout / 4))
            try:
                self._close_overdue(timeout)
            except Exception as e:  # the watchdog must outlive any one bad sweep
                log.error("header-timeout sweep failed with %s", type(e).__name__)

    def _close_overdue(self, timeout: int) -> None:
        overdue = set(self.heads.overdue(time.monotonic(), timeout))
        if not overdue:
            return
        server = ctx.master.addons.get("proxyserver")
        for handler in list(server.connections.values()):
            if handler.client.id in overdue:
                peer = handler.client.peername
                log.warning(
                    "closing client connection %s: no complete request head within %ss",
                    f"{peer[0]}:{peer[1]}" if peer else "?",
                    timeout,
                )
                self.state.metrics.limit_refusals.labels("header_timeout").inc()
                handler.close_connection(handler.client)
        for conn in overdue:  # closed now, or already gone without a disconnect hook
            self.heads.close(conn)

    def _limits(self, pool: str) -> Limits:
        found = self.state.policy.pools.get(pool)
        return found.limits if found is not None else Limits()

    def _check(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if flow.response or claim is None:
            return
        limits = self._limits(claim.pool)
        if not self.claims.open(flow.client_conn.id, claim.id, limits):
            self.state.metrics.limit_refusals.labels("connections").inc()
            message = (
                f"claim {claim.id!r} already has {limits.connections} open connections, the most its "
                "pool allows; close some and retry"
            )
            # HTTP/2 forbids connection-specific headers (RFC 9113 §8.2.2): there each stream is refused.
            close = {"Connection": "close"} if flow.request.http_version.startswith("HTTP/1") else {}
            facts.refuse(flow, deny(Reason.TOO_MANY_CONNECTIONS, message, 429), close)
            return
        wait = self.claims.take(claim.id, limits, time.monotonic())
        if wait:
            self.state.metrics.limit_refusals.labels("rate").inc()
            message = (
                f"claim {claim.id!r} is over its pool's rate of {limits.rate:g} requests per second "
                f"(burst {limits.burst}); retry after the Retry-After seconds"
            )
            facts.refuse(
                flow, deny(Reason.RATE_LIMITED, message, 429), {"Retry-After": str(retry_after(wait))}
            )

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        passing = facts.PASSTHROUGH.get(data.client.id)
        if passing is None or data.server.error:
            return
        try:
            data.server.error = self._passthrough_refusal(data.client.id, passing.claim)
        except Exception as e:  # fail closed: no pass-through without its limits checked
            log.error("limits.server_connect failed with %s", type(e).__name__)
            data.server.error = "refused: the claim's limits could not be checked"

    def _passthrough_refusal(self, conn: str, claim: Any) -> str | None:
        limits = self._limits(claim.pool)
        if not self.claims.open(conn, claim.id, limits):
            self.state.metrics.limit_refusals.labels("connections").inc()
            return f"{REFUSED_CONNECTIONS}: claim {claim.id!r} already holds {limits.connections}"
        if self.claims.take(claim.id, limits, time.monotonic()):
            self.state.metrics.limit_refusals.labels("rate").inc()
            return f"{REFUSED_RATE}: claim {claim.id!r} is over {limits.rate:g} requests per second"
        return None

    def client_connected(self, client: connection.Client) -> None:
        self.heads.wait(client.id, time.monotonic())
        if not isinstance(client.proxy_mode, mode_specs.TransparentMode) or not client.peername:
            return
        try:  # transparent: the source names the claim now, so the connection counts from now
            claim = self.state.registry.claim_for_source(client.peername[0])
            if claim is not None and not self.claims.open(client.id, claim.id, self._limits(claim.pool)):
                self.state.metrics.limit_refusals.labels("connections").inc()
                log.warning("closing a new connection of claim %r: at its connection limit", claim.id)
                client.error = "too many connections"  # mitmproxy closes it before reading a byte
        except Exception as e:  # fail closed
            log.error("limits.client_connected failed with %s", type(e).__name__)
            client.error = "the claim's limits could not be checked"

    def client_disconnected(self, client: connection.Client) -> None:
        self.claims.close(client.id)
        self.heads.close(client.id)

    @facts.fail_closed
    def http_connect(self, flow: http.HTTPFlow) -> None:
        self.heads.head(flow.client_conn.id)
        self._check(flow)

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.heads.head(flow.client_conn.id)
        self._check(flow)

    def _end(self, flow: http.HTTPFlow) -> None:
        if not flow.metadata.get(_ENDED):
            flow.metadata[_ENDED] = True
            self.heads.finished(flow.client_conn.id, time.monotonic())

    def http_connected(self, flow: http.HTTPFlow) -> None:
        self._end(flow)  # the tunnel's first request head is due now (after the TLS handshake)
        if flow.metadata.get(facts.OPAQUE):
            self.heads.exempt(flow.client_conn.id)

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        self._end(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._end(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._end(flow)

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        self.heads.exempt(flow.client_conn.id)
