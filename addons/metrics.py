"""metrics: Prometheus counters per flow (see :mod:`proxy.metrics`), at the same moments the
audit addon writes its event, from the same facts and in the same words: the decision, reason and
credentials of :mod:`addons.ending`. Label values are bounded."""

from __future__ import annotations

from typing import Any

from mitmproxy import connection, http

from addons import ending, facts
from proxy.engine.state import State

_DONE = "surrogate.counted"


class Metrics:
    def __init__(self, state: State) -> None:
        self.m = state.metrics
        # Label children resolved once each (prometheus-client's .labels() costs ~2 µs a call;
        # the label sets are bounded, see proxy/metrics.py).
        self._requests: dict[tuple[str, ...], Any] = {}
        self._substitutions: dict[str, Any] = {}

    def _request(self, *labels: str) -> Any:
        child = self._requests.get(labels)
        if child is None:
            child = self._requests[labels] = self.m.requests.labels(*labels)
        return child

    def _count(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(_DONE):
            return
        flow.metadata[_DONE] = True
        decision = ending.decision(flow)  # the audit event's decision and reason (addons/ending.py)
        status = flow.response.status_code if flow.response else flow.metadata.get(facts.ANSWERED, 0)
        action = decision.action.value if decision else "none"
        reason = decision.reason.value if decision else "none"
        self._request(action, reason, f"{status // 100}xx" if status else "none").inc()
        for name in ending.used(flow):
            child = self._substitutions.get(name)
            if child is None:
                child = self._substitutions[name] = self.m.substitutions.labels(name)
            child.inc()
        if violated := flow.metadata.get(facts.VIOLATED):
            self.m.violations.labels(violated).inc()
        if decision is not None and decision.allowed and flow.response and flow.response.timestamp_end:
            self.m.upstream_seconds.observe(flow.response.timestamp_end - flow.request.timestamp_start)

    def response(self, flow: http.HTTPFlow) -> None:
        self._count(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._count(flow)

    def http_connect_error(self, flow: http.HTTPFlow) -> None:
        self._count(flow)

    def http_connected(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(facts.OPAQUE):
            self._count(flow)

    def client_connected(self, client: connection.Client) -> None:
        self.m.open_connections.inc()

    def client_disconnected(self, client: connection.Client) -> None:
        self.m.open_connections.dec()
