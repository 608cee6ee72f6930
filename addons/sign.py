"""sign: credentials of kind ``hmac`` sign each request toward their hosts (proxy.core.hmacsign).

After substitute (whose body stream it replaces on such a request), for a request over TLS
toward a host of a credential of kind ``hmac``:

- when the signature covers the body, the body is read whole before the head leaves (the
  signature is in the head): a ``Content-Length`` past the credential's ``max_body`` is refused
  413, a body without a declared length (HTTP/1 chunked, or HTTP/2 without ``Content-Length``
  on a method that carries one) is refused 411, before any upstream connection; placeholders in
  such a body are not swapped (the body is signed as the sandbox sent it);
- when the request is complete (``request``), ``timestamp_header`` is set to the current Unix
  time and ``header`` to the signature, whatever the sandbox sent; the credential is listed in
  the audit event's credentials like an injection; past the credential's ``max_requests`` the
  request is refused ``credential_budget_spent`` (counted by the registry's ``spend``, as a swap
  is) before it is signed.
"""

from __future__ import annotations

import time

from mitmproxy import http

from addons import facts
from proxy.core import hmacsign
from proxy.core.decide import Reason, deny
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Credential
from proxy.engine.state import State

SIGNING = "surrogate.signing"  # the credentials of kind hmac that sign this request
_BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


class Sign:
    def __init__(self, state: State) -> None:
        self.state = state

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:
            return
        claim = flow.metadata.get(facts.CLAIM)
        req = flow.request
        if claim is None or req.scheme != "https":
            return
        host = flow.metadata.get(facts.HOST, "")
        signing = [c for c in claim.credentials if c.sign is not None and c.bound_to(host)]
        if not signing:
            return
        flow.metadata[SIGNING] = signing
        bound = (
            min(c.sign.max_body for c in signing if c.sign is not None and c.sign.signs_body)
            if any(c.sign is not None and c.sign.signs_body for c in signing)
            else None
        )
        if bound is None:
            return
        length = req.headers.get("content-length")
        if length is None:
            chunked = "transfer-encoding" in req.headers
            if chunked or (not req.http_version.startswith("HTTP/1") and req.method not in _BODILESS_METHODS):
                why = "a signed request body must declare its length (Content-Length): it is read whole"
                facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=411))
                return
        elif not length.strip().isdigit() or int(length) > bound:
            why = f"a signed request body is read whole to be signed: at most {bound} bytes"
            facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=413))
            return
        req.stream = False  # read whole (bounded above), then signed in `request`
        flow.metadata[facts.WHOLE_BODY] = True  # and stream, after this, leaves it so

    @facts.fail_closed
    def request(self, flow: http.HTTPFlow) -> None:
        signing: list[Credential] | None = flow.metadata.get(SIGNING)
        if not signing or flow.response or flow.error:
            return
        req = flow.request
        body = req.raw_content or b""
        if flow.metadata.get(facts.WHOLE_BODY):
            flow.metadata.setdefault(facts.BYTES, [0, 0])[0] = len(body)
        used = flow.metadata.setdefault(facts.USED, {})
        for c in signing:
            spec = c.sign
            assert spec is not None
            if spec.signs_body and len(body) > spec.max_body:
                why = f"a signed request body is read whole to be signed: at most {spec.max_body} bytes"
                facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=413))
                return
            try:
                secret, version = c.secret()
            except SecretUnavailable as e:
                facts.log.warning("credential unavailable: %s", e)
                why = f"credential {c.name!r} is unavailable; nothing was sent"
                facts.refuse(flow, deny(Reason.CREDENTIAL_UNAVAILABLE, why, status=502))
                return
            if self.state.registry.spend(flow.metadata[facts.CLAIM], [c.name]):  # max_requests
                allowed = flow.metadata.get(facts.DECISION)
                why = f"credential {c.name!r} has used up its request budget (max_requests); nothing was sent"
                rule = allowed.rule if allowed is not None else None
                facts.refuse(flow, deny(Reason.CREDENTIAL_BUDGET_SPENT, why, rule=rule))
                return
            now = int(time.time())
            target = req.data.path.decode("latin-1")
            message = hmacsign.string_to_sign(spec, now, req.method, target, body if spec.signs_body else b"")
            req.headers[spec.timestamp_header] = str(now)
            req.headers[spec.header] = hmacsign.signature(spec, secret, message)
            used[c.name] = version
            flow.metadata.setdefault(facts.APPLIED, {})[c.name] = "hmac_signed"
            self.state.registry.record_use(flow.metadata[facts.CLAIM], [c.name], now)
