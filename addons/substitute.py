"""substitute: placeholders → secrets in request headers, injections, violations.

Thin glue over :func:`proxy.substitute.substitute_request`: it runs only on requests the policy
allowed, hands over the header fields, the request target, the canonical host and whether the
upstream leg is TLS, and applies the outcome (new fields, or a 403 refusal).
"""

from __future__ import annotations

import dataclasses
import time

from mitmproxy import http

from addons import facts
from proxy.state import State
from proxy.substitute import substitute_request


class Substitute:
    def __init__(self, state: State) -> None:
        self.state = state

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:  # answered here: nothing to swap
            return
        allowed = flow.metadata.get(facts.DECISION)
        if allowed is None or not allowed.allowed:  # never swap on a flow the policy did not allow
            raise RuntimeError("substitute reached without an allow decision")
        claim = flow.metadata[facts.CLAIM]
        req = flow.request
        outcome = substitute_request(
            req.headers.fields,
            req.data.path,
            flow.metadata[facts.HOST],
            req.scheme == "https",
            claim.by_placeholder,
            claim.injections,
            time.time(),
        )
        if outcome.refusal is not None:
            if outcome.violated is not None:
                flow.metadata[facts.VIOLATED] = outcome.violated
            # keep the rule that allowed the host in the audit event
            facts.refuse(flow, dataclasses.replace(outcome.refusal, rule=allowed.rule))
            return
        if outcome.fields is not None:
            req.headers.fields = tuple(outcome.fields)
        flow.metadata[facts.USED] = outcome.used
        if outcome.used:
            self.state.registry.record_use(claim, list(outcome.used), time.time())
        flow.metadata[facts.CARRIED] = outcome.carried
