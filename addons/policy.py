"""policy: the pool's egress rules decide, before any upstream connection is made.

- CONNECT: decided on the canonical host and port in ``http_connect``; a refusal (403) is sent
  instead of ``200 Connection established``, so no upstream TCP or TLS ever starts (the proxy runs
  with the lazy connection strategy). A CONNECT allowed by a non-intercepting rule becomes an
  opaque TCP tunnel: TLS is not terminated and no credential can apply.
- Inside a tunnel: the CONNECT host, the TLS SNI and the Host header (``:authority`` on HTTP/2)
  are each chosen by the client; all three must name the same host (and the Host port, when
  given, the CONNECT port), else 421 Misdirected Request (RFC 9110 §15.5.20). Then the request
  is decided in full (host, port, method, path).
- The request target's own authority (an absolute-form ``GET https://other.test/x``, RFC 9112
  §3.2.2, or HTTP/2's ``:authority``) and every Host header field are names too: inside a tunnel
  each must be the tunnel's host, else 421 (never "decided for one host, read as another"). An
  agreeing absolute-form target is forwarded in origin form, so the upstream has one reading,
  with the decided authority as its Host field in place of any it sent (RFC 9112 §3.2.2;
  review r-h2auth: without one it reached the upstream with no Host at all, the secret
  swapped in).
- Plain-HTTP proxy requests (absolute-form) are decided on their URL and Host header.
"""

from __future__ import annotations

import time

from mitmproxy import connection, http, tls
from mitmproxy.proxy import layer, layers, mode_specs

from addons import facts
from proxy.core.decide import Decision, Reason, check_path, decide_connect, decide_request, deny
from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host, split_authority
from proxy.core.methods import method_readings
from proxy.core.paths import RequestPath, canonical_path
from proxy.engine.state import State


class Policy:
    def __init__(self, state: State) -> None:
        self.state = state
        self.opaque_pending: set[str] = set()
        # client connections whose ClientHello had a server_name extension mitmproxy could not
        # read as a host (``api.test:8443``, ``[::1]``, two names): their SNI is unknown, not absent
        self.unreadable_sni: set[str] = set()

    @facts.fail_closed
    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata[facts.CLAIM]
        host, port = flow.metadata[facts.AUTHORITY]
        decision = decide_connect(self.state.policy.pools[claim.pool], host, port)
        flow.metadata[facts.DECISION] = decision
        if not decision.allowed:
            facts.refuse(flow, decision)
            return
        flow.metadata[facts.ALLOWED_BY] = decision.rule
        if decision.rule is not None and not decision.rule.intercept:
            flow.metadata[facts.OPAQUE] = True  # resolve may still refuse it (own listener, special)

    def http_connected(self, flow: http.HTTPFlow) -> None:
        # Only a CONNECT that was answered 200: a refused one must not make the next tunnel on
        # the same connection opaque.
        if flow.metadata.get(facts.OPAQUE):
            self.opaque_pending.add(flow.client_conn.id)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """Transparent mode: a TLS connection whose SNI an opaque rule allows is passed through
        uninspected, to the SNI's address (resolve checks it is where the sandbox connected).
        Anything else is intercepted and its first request decided in full.

        Any mode: a server_name extension (RFC 6066 §3) mitmproxy does not read as one valid
        host name is not taken for no SNI: every request of that connection is refused 421
        (``authority_mismatch``), as a disagreeing SNI is; mitmproxy would otherwise drop it and
        the request would be decided on its Host alone."""
        context = data.context
        sni = data.client_hello.sni
        if sni is None and any(kind == 0 for kind, _ in data.client_hello.extensions):
            self.unreadable_sni.add(context.client.id)
            return
        if not isinstance(context.client.proxy_mode, mode_specs.TransparentMode) or not sni:
            return
        peer, original = context.client.peername, context.server.address
        claim = self.state.registry.claim_for_source(peer[0]) if peer else None
        pool = self.state.policy.pools.get(claim.pool) if claim else None
        if pool is None or original is None:
            return
        try:
            host = canonical_host(sni)
        except HostError:
            return
        decision = decide_connect(pool, host, original[1])
        if decision.allowed and decision.rule is not None and not decision.rule.intercept:
            data.ignore_connection = True  # resolve points the connection at the SNI's address
            facts.PASSTHROUGH[context.client.id] = facts.Passthrough(
                claim, host, original[1], decision, time.time()
            )

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        # The first layer decision after an opaque CONNECT is the tunnel's content.
        client_id = nextlayer.context.client.id
        if client_id in self.opaque_pending and not nextlayer.layer:
            self.opaque_pending.discard(client_id)
            nextlayer.layer = layers.TCPLayer(nextlayer.context, ignore=True)

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata[facts.CLAIM]
        # computed once, from the target as sent: every path matcher and the audit use it
        flow.metadata[facts.PATH] = canonical_path(flow.request.data.path)
        sent = flow.request.data.method.decode("ascii", "replace")
        flow.metadata[facts.METHODS] = method_readings(sent, flow.request.headers, flow.request.path)
        try:
            decision = self._decide(flow, claim.pool)
        except HostError as e:
            decision = deny(Reason.AUTHORITY_MISMATCH, str(e), status=400)
        flow.metadata[facts.DECISION] = decision
        if not decision.allowed:
            facts.refuse(flow, decision)
        else:
            flow.metadata[facts.ALLOWED_BY] = decision.rule

    def recheck(self, flow: http.HTTPFlow, pool_name: str) -> Decision:
        """The rules in force now, on a request they decided once (addons/approve.py: a held
        request, as of its approval). KeyError when the pool is no longer defined."""
        try:
            return self._decide(flow, pool_name)
        except HostError as e:
            return deny(Reason.AUTHORITY_MISMATCH, str(e), status=400)

    def client_disconnected(self, client: connection.Client) -> None:
        self.unreadable_sni.discard(client.id)

    def _decide(self, flow: http.HTTPFlow, pool_name: str) -> Decision:
        req = flow.request
        if flow.client_conn.id in self.unreadable_sni:
            why = "the TLS ClientHello's server name is not one valid host name (RFC 6066 §3)"
            return deny(Reason.AUTHORITY_MISMATCH, why, status=421)
        authority = flow.metadata.get(facts.AUTHORITY)
        original = flow.metadata.get(facts.ORIGINAL_DST)
        if original is not None:  # transparent: the name comes from the Host header (or SNI)
            named = req.host_header or flow.client_conn.sni or ""
            if not named:
                return deny(
                    Reason.AUTHORITY_MISMATCH, "request names no host (no Host header, no SNI)", status=421
                )
            authority = (split_authority(named)[0], original[1])
        elif authority is None:  # absolute-form request on the explicit proxy (plain HTTP)
            authority = (canonical_host(req.host), req.port)
        host, port = authority
        names = _names(req, flow.client_conn.sni)
        for what, value in names.items():
            name, given_port = split_authority(value) if value else ("", None)
            if name != host or (given_port is not None and given_port != port):
                return deny(
                    Reason.AUTHORITY_MISMATCH,
                    f"{what} {value!r} does not match the tunnel's host {host}:{port}",
                    status=421,
                )
        if req.data.authority and not req.is_http2:
            req.data.authority = b""  # absolute form, agreeing: the upstream gets the origin form
            # ...and the target's authority as its Host, in place of any sent (RFC 9112 §3.2.2)
            if "Host header" in names:
                req.headers["Host"] = _hostport(host, port, req.scheme)
            else:
                req.headers.insert(0, "Host", _hostport(host, port, req.scheme))
        # rewriting costs a header pass: skip it when both already spell the canonical name
        name = f"[{host}]" if ":" in host else host
        header = req.host_header or ""
        if req.host != host or header not in (name, f"{name}:{port}"):
            # the canonical, checked name (resolve connects it to the checked address) in every
            # field that names it; not mitmproxy's ``host`` setter, which writes an IPv6 literal
            # without its brackets (``Host: ::1:8443``, RFC 9110 §7.2: ``[::1]:8443``)
            req.data.host = host
            value = _hostport(host, port, req.scheme)
            if "Host" in req.headers:
                req.headers["Host"] = value
            if req.data.authority:
                req.data.authority = value.encode()
        flow.metadata[facts.HOST] = host
        # Inside a tunnel we terminated TLS for, only intercepting rules may allow a request: a
        # later `intercept: false` rule must not approve what the intercepting rule refused.
        in_tunnel = flow.metadata.get(facts.AUTHORITY) is not None or (
            original is not None and req.scheme == "https"
        )
        pool = self.state.policy.pools[pool_name]
        # the method as sent: mitmproxy's Request.method upper-cases it, but forwards the raw one,
        # and methods are case-sensitive (RFC 9110 §9.1), so "get" is not "GET"
        method = req.data.method.decode("ascii", "replace")
        path: RequestPath = flow.metadata[facts.PATH]
        claim = flow.metadata[facts.CLAIM]
        endpoints = [c.oauth.host for c in claim.oauth if c.oauth is not None]
        ambiguous = check_path(pool, host, path, endpoints)
        if ambiguous is not None:  # anything on this host that matches on paths could be misled
            return ambiguous
        scheme = "https" if req.scheme == "https" else "http"  # as it reached us, and will leave
        also = flow.metadata[facts.METHODS] - {method.upper()}  # an override names another method
        return decide_request(pool, host, port, method, path, in_tunnel, scheme, also)


def _hostport(host: str, port: int, scheme: str) -> str:
    """``host[:port]`` as a Host field spells it (RFC 9110 §7.2): brackets around an IPv6
    literal, no port when it is the scheme's default."""
    name = f"[{host}]" if ":" in host else host
    return name if port == {"https": 443, "http": 80}.get(scheme) else f"{name}:{port}"


def _names(req: http.Request, sni: str | None) -> dict[str, str]:
    """Every name the request gives its destination, each of which must be the decided host:
    the Host header (required: RFC 9112 §3.2; on HTTP/2 the ``:authority`` may stand in for
    it, RFC 9113 §8.3.1), the request target's authority (absolute form, RFC 9112 §3.2.2, or
    ``:authority``) and the TLS SNI. Each header field named Host counts, joined (hygiene
    refuses two)."""
    names: dict[str, str] = {}
    target = req.data.authority.decode("utf-8", "surrogateescape")
    if target:
        names["request target"] = target
    field = facts.header(req.headers.fields, b"host")
    if field is not None or not target:
        names["Host header"] = field or ""
    if sni:
        names["TLS SNI"] = sni
    return names
