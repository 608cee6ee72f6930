"""What addons tell each other, in ``flow.metadata`` under ``surrogate.*`` keys, and the one way
a flow is refused.

Keys (all optional until the addon that owns them has run):
- ``surrogate.request_id`` (str)        set by identify, on every flow
- ``surrogate.claim`` (Claim)           identify
- ``surrogate.authority`` (host, port)  identify: the canonical CONNECT target of the tunnel
- ``surrogate.decision`` (Decision)     whoever decided last: policy, substitute, or a refusal
- ``surrogate.opaque`` (bool)           policy: CONNECT allowed by a non-intercepting rule
- ``surrogate.used`` (dict name→version) substitute: credentials swapped or injected
- ``surrogate.carried`` (list[str])     substitute: placeholders passed unchanged
- ``surrogate.bytes`` ([int, int])      stream: request and response body bytes seen
"""

from __future__ import annotations

import json

from mitmproxy import http

from proxy.decide import Decision

REQUEST_ID = "surrogate.request_id"
CLAIM = "surrogate.claim"
AUTHORITY = "surrogate.authority"
DECISION = "surrogate.decision"
OPAQUE = "surrogate.opaque"
USED = "surrogate.used"
CARRIED = "surrogate.carried"
BYTES = "surrogate.bytes"

REQUEST_ID_HEADER = "X-Surrogate-Request-Id"


def refuse(flow: http.HTTPFlow, decision: Decision, headers: dict[str, str] | None = None) -> None:
    """Answer ``flow`` with ``decision``'s status and a JSON body the sandbox can show.

    The body holds the reason code, the sentence and the request id; decision messages never
    contain a secret value (they name credentials, hosts and rules only).
    """
    request_id = flow.metadata.get(REQUEST_ID, flow.id)
    body = json.dumps(
        {
            "error": decision.reason.value,
            "decision": decision.action.value,
            "message": decision.message,
            "request_id": request_id,
        }
    )
    flow.response = http.Response.make(
        decision.status,
        body.encode(),
        {"Content-Type": "application/json", REQUEST_ID_HEADER: request_id, **(headers or {})},
    )
    flow.metadata[DECISION] = decision
