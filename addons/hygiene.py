"""hygiene: refuse request heads that parsers could read differently; drop hop-by-hop headers.

The request line, or an HTTP/2 request's pseudo-header fields, is checked first: they become
an HTTP/1 request line when the upstream speaks HTTP/1 (issue 20).

Runs after identify (it needs the claim, to know whether TRACE would meet a credential) and
before policy. The rules are in :mod:`proxy.core.hygiene`.

Responses (review r4): toward a claim that holds credentials, a response whose body carries a
transfer coding other than chunked (``Transfer-Encoding: gzip, chunked``, RFC 9112 §7) is not
passed: mitmproxy forwards that body still coded, so neither token capture (addons/oauth.py)
nor the scrubber would read what the sandbox decodes. The connection is closed and the audit
event says ``unscannable_response``. This hook runs before both of them (the chain's order).
An upstream's response never carries surrogate's own marks: ``X-Surrogate-Request-Id`` and the
``surrogate`` member of ``Proxy-Status`` are dropped (review r-refusals), so that only a refusal
of surrogate's looks like one.
"""

from __future__ import annotations

from mitmproxy import http

from addons import facts, refusals
from proxy.core.decide import Reason, deny
from proxy.core.errors import HostError
from proxy.core.hosts import split_authority
from proxy.core.hygiene import check_head, check_request_line, transfer_coded
from proxy.core.refusals import without_ours


class Hygiene:
    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        req = flow.request
        claim = flow.metadata.get(facts.CLAIM)
        host = (flow.metadata.get(facts.AUTHORITY) or (req.host_header or req.host, 0))[0]
        try:
            host = split_authority(host)[0]
        except HostError:
            host = ""  # policy refuses it; nothing here is bound to it
        method = req.data.method.decode("ascii", "replace")
        # only TRACE asks, and a walk over every credential per request grows with the claim
        credentialed = (
            method.upper() == "TRACE"
            and claim is not None
            and any(c.bound_to(host) for c in claim.credentials)
        )
        d = req.data
        verdict = check_request_line(
            d.method, d.scheme, d.authority, d.path, not req.is_http11 and not req.is_http10
        )
        if not verdict.status:
            verdict = check_head(req.headers.fields, method, credentialed)
        if verdict.status:
            facts.refuse(flow, deny(Reason.BAD_REQUEST_HEAD, verdict.message, status=verdict.status))
            return
        if verdict.drop:
            req.headers.fields = tuple((n, v) for n, v in req.headers.fields if n.lower() not in verdict.drop)

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response, claim = flow.response, flow.metadata.get(facts.CLAIM)
        if response is not None and _from_upstream(flow):
            _drop_forged_refusal(response)
        if response is None or claim is None or not claim.credentials:
            return
        status = response.status_code
        if flow.request.method.upper() == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return  # no body (RFC 9112 §6.3), nothing coded to read
        coded = transfer_coded(response.headers.fields)
        if not coded:
            return
        why = f"Transfer-Encoding {coded[:40]!r} (a coding other than chunked)"
        facts.log.warning("response %s cannot be scanned for secrets: %s; connection closed",
                          flow.metadata.get(facts.REQUEST_ID, flow.id), why)  # fmt: skip
        flow.metadata[facts.DECISION] = deny(
            Reason.UNSCANNABLE_RESPONSE, f"response body cannot be scanned for secrets: {why}", status=502
        )
        if flow.killable:
            flow.kill()


def _from_upstream(flow: http.HTTPFlow) -> bool:
    """Not an answer of surrogate's (a refusal, a hook route's): those set a refusal or a route."""
    decision = flow.metadata.get(facts.DECISION)
    return facts.HOOK not in flow.metadata and (decision is None or decision.allowed)


_OURS = (b"proxy-status", refusals.REQUEST_ID_HEADER.lower().encode())


def _drop_forged_refusal(response: http.Response) -> None:
    """Only surrogate names itself in a response (review r-refusals): an upstream's
    ``X-Surrogate-Request-Id`` is dropped, and its ``Proxy-Status`` loses every member that
    names surrogate (:func:`proxy.core.refusals.without_ours`)."""
    fields = response.headers.fields
    if not any(n.lower() in _OURS for n, _ in fields):
        return
    kept = []
    for name, value in fields:
        low = name.lower()
        if low == _OURS[1]:
            continue
        if low == _OURS[0]:
            rest = without_ours(value.decode("latin-1"))
            if rest is None:
                continue
            value = rest.encode("latin-1")
        kept.append((name, value))
    response.headers.fields = tuple(kept)
