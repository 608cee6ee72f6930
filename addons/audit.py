"""audit: one JSON event per flow (structlog's processors, proxy.audit.emit), fields from :mod:`proxy.audit`.

Requests are logged when they end (``response`` or ``error``); a CONNECT is logged only when it
is refused or opens an opaque tunnel (an intercepted tunnel's requests are logged one by one). A
transparent-mode TLS pass-through (no CONNECT, no flow) is logged as a tunnel event with a null
method and status once its upstream connection opened, or failed (then with the reason). An
intercepted connection closed because its bytes were not HTTP (addons/tunnel.py) is logged the
same way, reason ``not_http``, when the client connection closes.

How a flow that the rules allowed ended (issue 18 item 6; decided in :mod:`addons.ending`, which
the metrics use too, so both say it in the same words):

- the upstream ended the response: ``allow`` ``allowed``, whatever the client did afterwards;
- the client went away after the response head, and everything forwarded of a
  ``text/event-stream`` body ends with a blank line (an event boundary), or of an NDJSON / JSON
  Lines body with a newline, or nothing of the body was forwarded yet: ``allow``
  ``client_closed`` (it stopped reading a stream it had received whole: the OpenAI SDK after
  ``data: [DONE]``);
- the client went away before the head, mid-event, mid-line or in any other body: ``error``
  ``client_closed`` (it cut the response short; not the upstream's failure);
- anything else (the upstream refused, failed TLS, closed or broke the response): ``error``
  ``upstream_error``.

``credentials`` lists only the credentials whose secret left the proxy (none for a request
refused before it was sent, or whose upstream TLS never completed), and a refusal after the
egress rules allowed a request names the rule that allowed it (issue 18 item 7).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from addons import ending, facts
from addons.limits import REFUSED_CONNECTIONS, REFUSED_RATE
from proxy import audit as a
from proxy.core.decide import Action, Decision, Reason
from proxy.core.policy import Claim


def _event(flow: http.HTTPFlow, kind: str) -> dict[str, Any]:
    req = flow.request
    decision = ending.decision(flow)  # how it ended, in the metrics' words too (addons/ending.py)
    claim = flow.metadata.get(facts.CLAIM)
    counts = flow.metadata.get(facts.BYTES, (0, 0))
    used = ending.used(flow)  # only credentials whose secret left
    end = (flow.response.timestamp_end if flow.response else None) or time.time()
    peer = flow.client_conn.peername
    event = {
        a.REQUEST_ID: flow.metadata.get(facts.REQUEST_ID, flow.id),
        a.CLAIM: claim.id if claim else None,
        a.POOL: claim.pool if claim else None,
        a.CLIENT: f"{peer[0]}:{peer[1]}" if peer else None,
        a.METHOD: req.data.method.decode("ascii", "replace"),  # as sent (see addons/policy.py)
        a.SCHEME: req.scheme if kind == "request" else None,
        a.HOST: flow.metadata.get(facts.HOST, req.host),
        a.PORT: req.port,
        # the target as sent (policy's canonical identity keeps it): never a swapped secret
        a.PATH: a.redact_path(path.target if (path := flow.metadata.get(facts.PATH)) else req.path)
        if kind == "request"
        else None,
        # With no response, mitmproxy answers an upstream failure with 502 (a refusal that closed
        # the connection has no status: nothing was sent).
        a.STATUS: flow.response.status_code
        if flow.response
        else flow.metadata.get(facts.ANSWERED)  # addons/errorpage.py's answer to a refusal of mitmproxy's
        or (502 if decision and decision.reason is Reason.UPSTREAM_ERROR else None),
        a.DECISION: decision.action.value if decision else None,
        a.REASON: decision.reason.value if decision else None,
        a.RULE: decision.rule.label() if decision and decision.rule else None,
        a.MESSAGE: None if decision is None or decision.allowed else decision.message,
        a.WOULD_DENY: decision.would_deny.value if decision and decision.would_deny else None,
        a.CREDENTIALS: [
            {**c, **_kind(claim, c["name"], flow.metadata.get("surrogate.sigv4_signed", {}))}
            for c in _credentials(used, flow.metadata.get(facts.APPLIED, {}))
        ],
        a.CARRIED: flow.metadata.get(facts.CARRIED, []),
        a.FORGED: flow.metadata.get(facts.FORGED, []),
        a.CARRIED_ON: [{"name": n, "surface": s} for n, s in flow.metadata.get(facts.CARRIED_ON, [])],
        a.VIOLATION_SURFACE: flow.metadata.get(facts.VIOLATION_SURFACE),
        a.BYTES_OUT: counts[0],
        a.BYTES_IN: counts[1],
        a.DURATION_MS: round((end - req.timestamp_start) * 1000, 3),
    }
    if (approval := flow.metadata.get("surrogate.approval")) is not None:  # addons/approve.py
        event["approval"] = approval
    return event


def _credentials(used: dict[str, int], applied: dict[str, str]) -> list[dict[str, Any]]:
    """``{"name", "version"}`` per credential whose secret left, with ``applied`` (issue 15:
    ``token_minted``, ``token_cached``, ``hmac_signed``) for a minted or signing kind."""
    out: list[dict[str, Any]] = []
    for n, v in used.items():
        out.append(
            {"name": n, "version": v, "applied": applied[n]} if n in applied else {"name": n, "version": v}
        )
    return out


def _passthrough_event(client: connection.Client, p: facts.Passthrough, error: str | None) -> dict[str, Any]:
    decision = p.decision
    if error is not None:
        reason = Reason.SPECIAL_ADDRESS if error.startswith("refused: special") else Reason.UPSTREAM_ERROR
        decision = Decision(Action.ERROR, reason, error, p.decision.rule, status=502)
        limited = ((REFUSED_CONNECTIONS, Reason.TOO_MANY_CONNECTIONS), (REFUSED_RATE, Reason.RATE_LIMITED))
        for prefix, limit in limited:
            if error.startswith(prefix):  # addons/limits.py: a pass-through over its claim's limits
                decision = Decision(Action.DENY, limit, error, p.decision.rule, status=429)
    peer = client.peername
    return {
        a.REQUEST_ID: client.id,
        a.CLAIM: p.claim.id if p.claim else None,
        a.POOL: p.claim.pool if p.claim else None,
        a.CLIENT: f"{peer[0]}:{peer[1]}" if peer else None,
        a.METHOD: None,  # no CONNECT: the sandbox's TLS went to its destination, redirected
        a.SCHEME: None,
        a.HOST: p.host,
        a.PORT: p.port,
        a.PATH: None,
        a.STATUS: None,  # nothing was answered: the bytes pass through
        a.DECISION: decision.action.value,
        a.REASON: decision.reason.value,
        a.RULE: decision.rule.label() if decision.rule else None,
        a.MESSAGE: None if decision.allowed else decision.message,
        a.WOULD_DENY: None,
        a.CREDENTIALS: [],
        a.CARRIED: [],
        a.FORGED: [],
        a.CARRIED_ON: [],
        a.VIOLATION_SURFACE: None,
        a.BYTES_OUT: 0,
        a.BYTES_IN: 0,
        a.DURATION_MS: round((time.time() - p.started) * 1000, 3),
    }


_DONE = "surrogate.audited"


class Audit:
    def _emit(self, flow: http.HTTPFlow, kind: str) -> None:
        # A flow can see both `response` and a late `error`; it is still one event.
        if flow.metadata.get(_DONE):
            return
        flow.metadata[_DONE] = True
        try:
            a.emit(kind, _event(flow, kind))
        except Exception as e:  # an audit failure must not take the flow down; say so on stderr
            logging.getLogger("surrogate").error("audit event for %s failed: %s", flow.id, type(e).__name__)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ending.watch(flow)  # last in the chain's stream wrappers: sees what the client was sent

    def response(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "request")

    def error(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "request")

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "tunnel")

    def http_connected(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(facts.OPAQUE):
            self._emit(flow, "tunnel")

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        if not data.ignore_connection:  # resolve turned a pass-through into interception
            facts.PASSTHROUGH.pop(data.context.client.id, None)

    def _passthrough(self, data: server_hooks.ServerConnectionHookData, error: str | None) -> None:
        p = facts.PASSTHROUGH.pop(data.client.id, None)
        if p is None:
            return
        try:
            a.emit("tunnel", _passthrough_event(data.client, p, error))
        except Exception as e:
            log = logging.getLogger("surrogate")
            log.error("audit event for %s failed: %s", data.client.id, type(e).__name__)

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._passthrough(data, None)

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._passthrough(data, data.server.error or "upstream connection failed")

    def client_disconnected(self, client: connection.Client) -> None:
        facts.PASSTHROUGH.pop(client.id, None)
        refused = facts.REFUSED_TUNNELS.pop(client.id, None)
        if refused is not None:  # bytes that were not HTTP (addons/tunnel.py): nothing relayed
            try:
                a.emit("tunnel", _passthrough_event(client, refused, None))
            except Exception as e:
                logging.getLogger("surrogate").error(
                    "audit event for %s failed: %s", client.id, type(e).__name__
                )


def _kind(claim: Claim | None, name: str, signed: dict[str, str]) -> dict[str, str]:
    """What a credential of a kind other than ``static`` applied, for its audit entry (issue 15:
    the kind and which signature or token, never a value): ``kind`` always; ``signature`` and
    ``header`` for ``hmac`` (the algorithm, the header it set); ``grant`` for ``oauth_client``
    (``applied`` says minted or cached); ``signature`` ``sigv4`` and ``applied`` ``sigv4_signed``
    for ``aws_sigv4`` once addons/sigv4.py re-signed with it. ``{}`` for a static credential."""
    cred = next((c for c in claim.kinded if c.name == name), None) if claim is not None else None
    if cred is None or cred.kind == "static":
        return {}
    out = {"kind": cred.kind}
    if cred.sign is not None:
        out |= {"signature": cred.sign.algorithm, "header": cred.sign.header}
    if cred.mint is not None:
        out["grant"] = cred.mint.spec.grant
    if name in signed:
        out |= {"signature": signed[name], "applied": "sigv4_signed"}
    return out
