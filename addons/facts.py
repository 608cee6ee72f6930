"""What addons tell each other, in ``flow.metadata`` under ``surrogate.*`` keys, and the one way
a flow is refused.

Keys (all optional until the addon that owns them has run):
- ``surrogate.request_id`` (str)        set by identify, on every flow
- ``surrogate.claim`` (Claim)           identify
- ``surrogate.authority`` (host, port)  identify: the canonical CONNECT target of the tunnel
- ``surrogate.host`` (str)              policy: the canonical destination host of a request (the
                                        request's own host becomes the checked IP in resolve)
- ``surrogate.original_dst`` (ip, port) identify, transparent mode: where the sandbox connected
- ``surrogate.decision`` (Decision)     whoever decided last: policy, substitute, or a refusal
- ``surrogate.allowed_by`` (EgressRule) policy: the rule that allowed the flow, kept for the audit
                                        when a later refusal replaces the decision (addons.ending)
- ``surrogate.opaque`` (bool)           policy: CONNECT allowed by a non-intercepting rule
- ``surrogate.used`` (dict name→version) substitute: credentials swapped or injected
- ``surrogate.carried`` (list[str])     substitute: placeholders passed unchanged
- ``surrogate.carried_on`` (list[(name, surface)]) substitute: the same, with surfaces
- ``surrogate.violated`` (str)          substitute: the credential whose placeholder was refused
- ``surrogate.violation_surface`` (str) substitute: where that placeholder was found
- ``surrogate.bytes`` ([int, int])      stream: request and response body bytes seen

A transparent-mode TLS pass-through has no flow at all: policy leaves what it decided in
:data:`PASSTHROUGH` (by client connection id) for audit, which logs it once the upstream
connection opened or failed.
- ``surrogate.forged`` (list[str])      forgery: where forged placeholders were found
- ``surrogate.hook`` (HookRoute)        hooks: the route that answers this request (no upstream)
- ``surrogate.path`` (RequestPath)      policy: the canonical identity of the request's path, from
                                        the target as sent (proxy.core.paths); every path matcher and
                                        the audit read it, never the (maybe substituted) target
- ``surrogate.answered`` (int)          errorpage: the status of its answer to a request mitmproxy
                                        refused itself (no ``flow.response``), for audit and metrics
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import mode_specs

from addons import refusals
from proxy.core.decide import Decision, Reason, deny

REQUEST_ID = "surrogate.request_id"
CLAIM = "surrogate.claim"
CLAIM_SWITCH = "surrogate.claim_switch"  # identify: the claim an explicit connection already serves
AUTHORITY = "surrogate.authority"
HOST = "surrogate.host"
ORIGINAL_DST = "surrogate.original_dst"
DECISION = "surrogate.decision"
ALLOWED_BY = "surrogate.allowed_by"
OPAQUE = "surrogate.opaque"
USED = "surrogate.used"
CARRIED = "surrogate.carried"
VIOLATED = "surrogate.violated"
CARRIED_ON = "surrogate.carried_on"
VIOLATION_SURFACE = "surrogate.violation_surface"
BYTES = "surrogate.bytes"
FORGED = "surrogate.forged"
HOOK = "surrogate.hook"
WHOLE_BODY = "surrogate.whole_body"  # addons/sign.py: this request body is read whole (bounded)
APPLIED = (
    "surrogate.applied"  # mint, sign: {credential name: "token_minted" | "token_cached" | "hmac_signed"}
)
PATH = "surrogate.path"
METHODS = "surrogate.methods"  # policy: every method a server may read the request as (proxy/core/methods.py)
ANSWERED = "surrogate.answered"  # errorpage: the status of the answer written for mitmproxy's refusal

REQUEST_ID_HEADER = refusals.REQUEST_ID_HEADER


@dataclass(frozen=True, slots=True)
class Passthrough:
    """A transparent-mode TLS connection passed through uninspected (an opaque egress rule)."""

    claim: Any  # proxy.core.policy.Claim, or None (a refused connection from no claim's address)
    host: str  # the canonical SNI
    port: int
    decision: Decision
    started: float  # unix seconds


PASSTHROUGH: dict[str, Passthrough] = {}
# An intercepted connection refused because its bytes were not HTTP (addons/tunnel.py), by
# client connection id; audit logs it when the client connection closes.
REFUSED_TUNNELS: dict[str, Passthrough] = {}

# A refused request's body is read (and held) by mitmproxy before the refusal can be sent, so a
# refusal of a request that may carry more than this closes the connection instead.
REFUSED_BODY_LIMIT = 64 * 1024

log = logging.getLogger("surrogate")

Hook = Callable[[Any, Any], None]


def header(fields: tuple[tuple[bytes, bytes], ...], name: bytes) -> str | None:
    """The value of header ``name`` (lower-case bytes) as ``Headers.get`` gives it: every field
    of that name joined with ", ", decoded as mitmproxy decodes (UTF-8, surrogateescape); None
    when absent. On the raw fields: the Headers mapping API decodes every name on each call."""
    values = [v for n, v in fields if n.lower() == name]
    if not values:
        return None
    return b", ".join(values).decode("utf-8", "surrogateescape")


def is_transparent(flow: Any) -> bool:
    return isinstance(flow.client_conn.proxy_mode, mode_specs.TransparentMode)


def fail_closed(hook: Hook) -> Hook:
    """Wrap an addon hook so that any exception refuses the flow instead of letting it pass.

    mitmproxy logs an addon's exception and carries on with the flow as it is, which for a
    security check means failing open. Only the exception's type is logged (its message may hold
    client input).
    """

    @functools.wraps(hook)
    def guarded(self: Any, flow: Any) -> None:
        try:
            hook(self, flow)
        except Exception as e:
            log.error(
                "%s.%s failed with %s; request %s refused",
                type(self).__name__,
                hook.__name__,
                type(e).__name__,
                flow.metadata.get(REQUEST_ID, flow.id),
            )
            refuse(flow, deny(Reason.INTERNAL_ERROR, "surrogate could not process this request", status=400))

    return guarded


def _may_carry_large_body(req: http.Request) -> bool:
    if req.method == "CONNECT":
        return False
    length = req.headers.get("content-length")
    if length is not None:
        return not (length.isascii() and length.isdigit() and int(length) <= REFUSED_BODY_LIMIT)
    # HTTP/1 without Content-Length carries a body only when chunked (RFC 9112 §6.3); an HTTP/2
    # request without one is answered, and mitmproxy's stream_large_bodies bounds what it reads.
    return req.http_version.startswith("HTTP/1") and "transfer-encoding" in req.headers


def refuse(flow: http.HTTPFlow, decision: Decision, headers: dict[str, str] | None = None) -> None:
    """Answer ``flow`` with ``decision``'s status and a JSON body the sandbox can show, or, when
    the request may carry a large body, close the connection (the audit event still says why).

    The answer is built by :func:`addons.refusals.answer` (JSON with the reason code, the sentence
    and the request id, ``Proxy-Status``; a gRPC answer to a gRPC request); decision messages
    never contain a secret value (they name credentials, hosts and rules only).
    """
    flow.metadata[DECISION] = decision
    if flow.response is None:  # refused before the request was sent: no secret left (addons.ending)
        flow.metadata.pop(USED, None)
    if _may_carry_large_body(flow.request):
        flow.kill()
        return
    # An addon earlier in the chain may have set up request-body streaming (substitute does for
    # every claim with credentials); mitmproxy 12.3 cannot answer a flow that streams its request
    # ("Can't set a response and enable streaming at the same time": the connection hung and the
    # crash report logged the body). The refused body is small (see above): let it be read.
    flow.request.stream = False
    request_id = flow.metadata.get(REQUEST_ID, flow.id)
    flow.response = refusals.answer(decision, request_id, flow.request, headers=headers)
    flow.metadata[DECISION] = decision
