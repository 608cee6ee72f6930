"""forgery: refuse placeholders with a valid surrogate checksum that the claim does not hold.

Thin glue over :func:`proxy.core.forgery.find_forged`, on requests the policy allowed, before
substitution: ``403 forged_placeholder`` (a violation), with the places in the audit event's
``forged`` field. Why refuse instead of passing such strings inert is in :mod:`proxy.core.forgery`.
"""

from __future__ import annotations

from mitmproxy import http

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.core.forgery import find_forged


class Forgery:
    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata[facts.CLAIM]
        places = find_forged(flow.request.headers.fields, flow.request.data.path, claim.by_placeholder)
        if not places:
            return
        flow.metadata[facts.FORGED] = places
        allowed = flow.metadata.get(facts.DECISION)
        message = (
            f"a placeholder in {places[0]} was issued by surrogate but is not held by claim "
            f"{claim.id!r} (it is another claim's, or was deleted); nothing was sent"
        )
        decision = deny(Reason.FORGED_PLACEHOLDER, message, rule=allowed.rule if allowed else None)
        facts.refuse(flow, decision)
