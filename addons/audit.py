"""audit: one structlog JSON event per flow, fields from :mod:`proxy.audit`.

Requests are logged when they end (``response`` or ``error``); a CONNECT is logged only when it
is refused or opens an opaque tunnel (an intercepted tunnel's requests are logged one by one).
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import http

from addons import facts
from proxy import audit as a
from proxy.decide import Action, Decision, Reason


def _event(flow: http.HTTPFlow, kind: str) -> dict[str, Any]:
    req = flow.request
    decision: Decision | None = flow.metadata.get(facts.DECISION)
    claim = flow.metadata.get(facts.CLAIM)
    if flow.error and (decision is None or decision.allowed):
        rule = decision.rule if decision else None
        decision = Decision(Action.ERROR, Reason.UPSTREAM_ERROR, flow.error.msg, rule, status=502)
    counts = flow.metadata.get(facts.BYTES, (0, 0))
    end = (flow.response.timestamp_end if flow.response else None) or time.time()
    peer = flow.client_conn.peername
    return {
        a.REQUEST_ID: flow.metadata.get(facts.REQUEST_ID, flow.id),
        a.CLAIM: claim.id if claim else None,
        a.POOL: claim.pool if claim else None,
        a.CLIENT: f"{peer[0]}:{peer[1]}" if peer else None,
        a.METHOD: req.method,
        a.SCHEME: req.scheme if kind == "request" else None,
        a.HOST: req.host,
        a.PORT: req.port,
        a.PATH: a.redact_path(req.path) if kind == "request" else None,
        a.STATUS: flow.response.status_code if flow.response else None,
        a.DECISION: decision.action.value if decision else None,
        a.REASON: decision.reason.value if decision else None,
        a.RULE: decision.rule.label() if decision and decision.rule else None,
        a.MESSAGE: None if decision is None or decision.allowed else decision.message,
        a.CREDENTIALS: [{"name": n, "version": v} for n, v in flow.metadata.get(facts.USED, {}).items()],
        a.CARRIED: flow.metadata.get(facts.CARRIED, []),
        a.BYTES_OUT: counts[0],
        a.BYTES_IN: counts[1],
        a.DURATION_MS: round((end - req.timestamp_start) * 1000, 3),
    }


_DONE = "surrogate.audited"


class Audit:
    def __init__(self) -> None:
        self.log = a.logger()

    def _emit(self, flow: http.HTTPFlow, kind: str) -> None:
        # A flow can see both `response` and a late `error`; it is still one event.
        if flow.metadata.get(_DONE):
            return
        flow.metadata[_DONE] = True
        self.log.info(kind, **_event(flow, kind))

    def response(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "request")

    def error(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "request")

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        self._emit(flow, "tunnel")

    def http_connected(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(facts.OPAQUE):
            self._emit(flow, "tunnel")
