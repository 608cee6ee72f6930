"""sign: credentials of kind ``hmac`` sign each request toward their hosts (proxy.core.hmacsign).

After substitute (whose body stream it replaces on such a request), for a request over TLS
toward a host of a credential of kind ``hmac``:

- when no signature covers the body, the head is signed in ``requestheaders``: a body that
  streams sends the head right after that hook, before ``request`` runs;
- when the signature covers the body, the body is read whole before the head leaves (the
  signature is in the head): a ``Content-Length`` past the credential's ``max_body`` is refused
  413, a body without a declared length (HTTP/1 chunked, or HTTP/2 without ``Content-Length``
  on a method that carries one) is refused 411, before any upstream connection; placeholders in
  such a body are not swapped (the body is signed as the sandbox sent it). ``max_body`` is at
  most mitmproxy's ``stream_large_bodies`` (1 MiB, proxy/engine/master.py): past it mitmproxy
  would start streaming the body it was to buffer and send the head before it is signed (a
  flow where that happened anyway is closed in ``request`` before its end is sent);
- an HTTP/2 ``GET``/``HEAD``/``OPTIONS``/``DELETE`` without ``Content-Length``: whether DATA
  follows is not known at the head (mitmproxy does not pass END_STREAM to the hook), and every
  HTTP/2 client sends such a GET. It is signed over the empty body in ``requestheaders``; a
  DATA byte on it refuses it (411 in the audit): no byte of that body is buffered or forwarded,
  and both connections are closed in ``request``, before the end of the request is sent, so the
  upstream never gets a whole request (decision, review r-sign2: closing from inside the body
  stream lost the flow's audit event in about one run in three, measured);
- otherwise, when the request is complete (``request``), ``timestamp_header`` is set to the
  current Unix time and ``header`` to the signature, whatever the sandbox sent (every field of
  either name, in any case, is replaced); the credential is listed in the audit event's
  credentials like an injection; past the credential's ``max_requests`` the request is refused
  ``credential_budget_spent`` (counted by the registry's ``spend``, as a swap is) before it is
  signed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mitmproxy import http

from addons import facts
from addons.substitute import _close
from proxy.core import hmacsign
from proxy.core.decide import Reason, deny
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Credential
from proxy.engine.state import State

SIGNING = "surrogate.signing"  # the credentials of kind hmac that sign this request
UNSIGNED_BODY = "surrogate.signing_unsigned_body"  # DATA on a request signed over the empty body
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
        signing = [c for c in claim.signing if c.bound_to(host)]
        if not signing:
            return
        bodied = [c.sign.max_body for c in signing if c.sign is not None and c.sign.signs_body]
        if not bodied:
            # nothing signed needs the body: the head is signed now, before it can leave (a
            # streamed body sends the head right after this hook; ``request`` comes after the body)
            self._sign(flow, signing, b"")
            return
        bound = min(bodied)
        length = req.headers.get("content-length")
        if length is None:
            chunked = "transfer-encoding" in req.headers
            if chunked or (not req.http_version.startswith("HTTP/1") and req.method not in _BODILESS_METHODS):
                why = "a signed request body must declare its length (Content-Length): it is read whole"
                facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=411))
                return
            if not req.http_version.startswith("HTTP/1"):
                # HTTP/2 (or 3) GET/HEAD/OPTIONS/DELETE without Content-Length: whether DATA
                # follows is not known here. Signed over the empty body now; a DATA byte refuses
                # it (nothing buffered or forwarded; closed in `request`, before its end leaves).
                if self._sign(flow, signing, b""):
                    req.stream = _no_body(flow)
                return
        elif not length.strip().isdigit() or int(length) > bound:
            why = f"a signed request body is read whole to be signed: at most {bound} bytes"
            facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=413))
            return
        flow.metadata[SIGNING] = signing
        req.stream = False  # read whole (bounded above), then signed in `request`
        flow.metadata[facts.WHOLE_BODY] = True  # and stream, after this, leaves it so

    @facts.fail_closed
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.metadata.get(UNSIGNED_BODY):
            _close(flow)  # before its end is sent: the upstream never gets a whole request
            return
        signing: list[Credential] | None = flow.metadata.get(SIGNING)
        if not signing or flow.response or flow.error:
            return
        req = flow.request
        if req.stream:
            # mitmproxy streams a body it was to buffer once it passes stream_large_bodies (the
            # head has left, unsigned): max_body is held below that, so this is a bound broken
            why = "a signed request body was streamed before it could be signed"
            flow.metadata[facts.DECISION] = deny(Reason.BAD_REQUEST_BODY, why, status=413)
            facts.log.warning("request %s: %s; connection closed", flow.id, why)
            _close(flow)
            return
        body = req.raw_content or b""
        if flow.metadata.get(facts.WHOLE_BODY):
            flow.metadata.setdefault(facts.BYTES, [0, 0])[0] = len(body)
        self._sign(flow, signing, body)

    def _sign(self, flow: http.HTTPFlow, signing: list[Credential], body: bytes) -> bool:
        """Set each credential's timestamp and signature headers; False when refused."""
        req = flow.request
        used = flow.metadata.setdefault(facts.USED, {})
        for c in signing:
            spec = c.sign
            assert spec is not None
            if spec.signs_body and len(body) > spec.max_body:
                why = f"a signed request body is read whole to be signed: at most {spec.max_body} bytes"
                facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=413))
                return False
            try:
                secret, version = c.secret()
            except SecretUnavailable as e:
                facts.log.warning("credential unavailable: %s", e)
                why = f"credential {c.name!r} is unavailable; nothing was sent"
                facts.refuse(flow, deny(Reason.CREDENTIAL_UNAVAILABLE, why, status=502))
                return False
            if self.state.registry.spend(flow.metadata[facts.CLAIM], [c.name]):  # max_requests
                allowed = flow.metadata.get(facts.DECISION)
                why = f"credential {c.name!r} has used up its request budget (max_requests); nothing was sent"
                rule = allowed.rule if allowed is not None else None
                facts.refuse(flow, deny(Reason.CREDENTIAL_BUDGET_SPENT, why, rule=rule))
                return False
            now = int(time.time())
            target = req.data.path.decode("latin-1")
            message = hmacsign.string_to_sign(spec, now, req.method, target, body if spec.signs_body else b"")
            req.headers[spec.timestamp_header] = str(now)
            req.headers[spec.header] = hmacsign.signature(spec, secret, message)
            used[c.name] = version
            flow.metadata.setdefault(facts.APPLIED, {})[c.name] = "hmac_signed"
            self.state.registry.record_use(flow.metadata[facts.CLAIM], [c.name], now)
        return True


def _no_body(flow: http.HTTPFlow) -> Callable[[bytes], bytes]:
    """The body stream of a request signed over the empty body: no byte passes; any byte refuses
    the request, whose connections ``request`` closes before the request's end is sent."""

    def stream(chunk: bytes) -> bytes:
        if chunk and UNSIGNED_BODY not in flow.metadata:
            flow.metadata[UNSIGNED_BODY] = True
            why = "a signed HTTP/2 request without Content-Length carried a body; it was signed over none"
            flow.metadata[facts.DECISION] = deny(Reason.BAD_REQUEST_BODY, why, status=411)
            facts.log.warning("request %s: %s; connection closed", flow.id, why)
        return b""

    return stream
