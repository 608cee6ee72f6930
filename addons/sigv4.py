"""sigv4: requests signed by the sandbox with an ``aws_sigv4`` credential's placeholder keys are
verified as the placeholder's and re-signed with the real key (thin glue over
:mod:`proxy.core.sigv4` and :mod:`proxy.core.sigv4chunks`).

It runs after policy and forgery, before substitute, on the request as it will reach the
upstream. Which payload, which path:
- a declared payload hash (``X-Amz-Content-Sha256`` hex) or ``UNSIGNED-PAYLOAD``, and the
  presigned query form: the head is re-signed in ``requestheaders``; the body streams as it is.
  A declared hash is not recomputed here: the upstream checks it against the body (S3 answers
  ``XAmzContentSHA256Mismatch``) and the signature only proves the hash, so a wrong one cannot
  pass (decision: trust the upstream, documented in README "Decisions").
- ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (aws-chunked): every chunk is verified on the
  placeholder chain and re-signed on the real chain as it streams (flat memory, bounded by the
  largest chunk); a bad chunk closes both connections before its bytes leave.
- ``STREAMING-UNSIGNED-PAYLOAD-TRAILER`` (botocore's uploads): only the head is signed.
- no declared hash (services other than S3, e.g. STS's form POST): the body is read whole, at
  most ``MAX_HASHED_BODY`` bytes by its Content-Length, hashed, verified and re-signed in
  ``request`` before anything is sent. Without a length it is signed over the empty body; on
  HTTP/2, where DATA may still follow such a head, no byte of it passes and the request is
  closed unfinished (addons/sign.py ``_no_body``; review r-sign2).

Refusals (403, reason codes in :class:`proxy.core.decide.Reason`): ``sigv4_bad_signature``,
``sigv4_scope_refused``, ``sigv4_wrong_key`` (a placeholder-shaped key id not this claim's, or a
wrong session token: a violation), ``sigv4_malformed`` (also: another credential's placeholder in
a signed header or the signed target, which substitute would swap after the re-signing),
``sigv4_unsigned`` (the placeholder access key id sent in a request that is not SigV4-signed),
``placeholder_violation`` (the credential is not bound to this host); ``credential_budget_spent``
(403) once the credential's ``max_requests`` are used up: a request verified as the placeholder's
is counted, like a swap, by the registry's ``spend`` (the store's counter for a store credential,
on every worker and node), right before the real signature is set — a refused request is not
counted.
"""

from __future__ import annotations

import hashlib
import time
from urllib.parse import unquote_to_bytes

from mitmproxy import http

from addons import facts
from proxy.core import placeholders
from proxy.core.decide import Reason, deny
from proxy.core.policy import Claim, Credential
from proxy.core.sigv4 import STREAMING, Resigned, Signed, SigV4Error, parse, real_keys, resign, signing_key
from proxy.core.sigv4chunks import ChunkResigner
from proxy.engine.state import State

MAX_HASHED_BODY = 1024 * 1024
HOLD = "surrogate.sigv4_hold"  # (credential, claim): the body is read whole, signed in ``request``
STREAMED = "surrogate.sigv4_streamed"  # aws-chunked: this addon's stream re-signs the body
SIGNED = "surrogate.sigv4_signed"  # audit: {credential name: "sigv4"}
SIGNATURES = "surrogate.sigv4_signatures"  # ((real seed, the sandbox's seed),): scrub pairs of this flow


def _signers(claim: Claim) -> list[Credential]:
    return list(claim.sigv4)  # computed once per claim: per-request work does not grow with it


def _swappable(claim: Claim | None, cred: Credential, signed: Signed, req: http.Request) -> str | None:
    """A placeholder (not this credential's own) in what the signature covers, or None.

    Substitute runs after this addon and swaps placeholders in headers and the query: one in a
    signed part would change what the real signature covers, so the upstream refuses it, and an
    S3 mismatch answer repeats the canonical request it computed, the swapped secret in hex
    (``CanonicalRequestBytes``), which no scrub form covers. Refused (decision, review r-sign2).
    """
    own = set(cred.placeholders())
    names = set(signed.signed_headers)
    values = [v for k, v in req.headers.fields if k.decode("latin-1").lower() in names]
    target = req.data.path
    text = b"\n".join([target, unquote_to_bytes(target), *values])
    others = {p for c in (claim.credentials if claim else ()) for p in c.placeholders()} - own
    for p in others:
        if p.encode() in text:
            return p
    for m in placeholders.find(text):
        if m.group().decode("ascii") not in own:
            return m.group().decode("ascii")
    return None


class SigV4:
    def __init__(self, state: State) -> None:
        self.state = state

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:
            return
        claim: Claim | None = flow.metadata.get(facts.CLAIM)
        creds = _signers(claim) if claim is not None else []
        if not creds:
            return
        req = flow.request
        try:
            signed = parse(req.path, req.headers.fields)
        except SigV4Error as e:
            return self._refuse(flow, e)
        if signed is None:
            raw = req.data.path + b"\n" + b"\n".join(v for _, v in req.headers.fields)
            if any(c.placeholder.encode() in raw for c in creds):
                why = "the placeholder access key id was sent in a request that is not SigV4-signed"
                facts.refuse(flow, deny(Reason.SIGV4_UNSIGNED, why))
            return
        cred = next((c for c in creds if c.placeholder == signed.access_key_id), None)
        if cred is None:
            if placeholders.is_placeholder(signed.access_key_id):
                why = "the request is signed with a placeholder access key id this claim does not hold"
                facts.refuse(flow, deny(Reason.SIGV4_WRONG_KEY, why))
            return  # signed with a key that is not surrogate's: the sandbox's own business
        if not cred.bound_to(flow.metadata[facts.HOST]) or req.scheme != "https":
            flow.metadata[facts.VIOLATED] = cred.name
            why = f"credential {cred.name!r} is not bound to this host (or not over TLS); nothing was sent"
            facts.refuse(flow, deny(Reason.PLACEHOLDER_VIOLATION, why))
            return
        if _swappable(claim, cred, signed, req) is not None:
            why = (
                "a SigV4-signed header or the signed request target carries another credential's "
                "placeholder: swapping it after re-signing would break the signature"
            )
            facts.refuse(flow, deny(Reason.SIGV4_MALFORMED, why))
            return
        if signed.payload_hash is None:
            length = req.headers.get("content-length")
            if length is None and "transfer-encoding" not in req.headers:
                self._apply(flow, cred, signed, hashlib.sha256(b"").hexdigest())
                if not req.http_version.startswith("HTTP/1") and flow.response is None:
                    # HTTP/2 without a length: DATA may follow a head signed over the empty
                    # body; none of it passes, and addons/sign.py closes the request unfinished
                    from addons.sign import _no_body

                    flow.metadata[STREAMED] = True  # substitute leaves this body alone
                    req.stream = _no_body(flow)
                return None
            if length is None or not length.isdigit() or int(length) > MAX_HASHED_BODY:
                why = (
                    "a SigV4 body without X-Amz-Content-Sha256 must declare a Content-Length "
                    f"up to {MAX_HASHED_BODY}"
                )
                facts.refuse(flow, deny(Reason.SIGV4_MALFORMED, why, status=413))
                return
            flow.metadata[HOLD] = (cred, signed)
            return
        self._apply(flow, cred, signed, None)

    @facts.fail_closed
    def request(self, flow: http.HTTPFlow) -> None:
        held = flow.metadata.pop(HOLD, None)
        if held is None or flow.response or flow.error:
            return
        cred, signed = held
        body = flow.request.raw_content or b""
        self._apply(flow, cred, signed, hashlib.sha256(body).hexdigest())

    def _apply(self, flow: http.HTTPFlow, cred: Credential, signed: Signed, body_hash: str | None) -> None:
        req = flow.request
        spec = cred.sigv4
        assert spec is not None
        try:
            secret, version = cred.secret()
            real = real_keys(secret.reveal())
            out = resign(
                req.method, req.path, req.headers.fields, req.host_header or req.pretty_host, signed,
                spec.placeholder_keys(cred.placeholder), real, spec.allowed, body_hash,
            )  # fmt: skip
        except SigV4Error as e:
            return self._refuse(flow, e)
        claim: Claim = flow.metadata[facts.CLAIM]
        if self.state.registry.spend(claim, [cred.name]):  # max_requests, as addons/substitute.py counts
            allowed = flow.metadata.get(facts.DECISION)
            why = f"credential {cred.name!r} has used up its request budget (max_requests); nothing was sent"
            rule = allowed.rule if allowed is not None else None
            facts.refuse(flow, deny(Reason.CREDENTIAL_BUDGET_SPENT, why, rule=rule))
            return
        self.state.registry.record_use(claim, [cred.name], time.time())
        req.headers.fields = tuple(out.fields)
        req.data.path = out.target.encode("ascii")
        flow.metadata.setdefault(facts.USED, {})[cred.name] = version
        flow.metadata.setdefault(SIGNED, {})[cred.name] = "sigv4"
        # a real-key signature reflected back (S3's SignatureProvided, an echoed Authorization or
        # Location) is scrubbed to the sandbox's own: it never holds a signature it did not make
        flow.metadata[SIGNATURES] = ((out.seed.encode(), out.placeholder_seed.encode()),)
        if signed.payload_hash == STREAMING:
            self._stream(flow, out, spec.placeholder_secret, real.secret_access_key)

    def _stream(self, flow: http.HTTPFlow, out: Resigned, placeholder_secret: str, real_secret: str) -> None:
        s = out.signed
        resigner = ChunkResigner(
            s.amz_date, s.scope,
            signing_key(placeholder_secret, s.date, s.region, s.service), out.placeholder_seed,
            signing_key(real_secret, s.date, s.region, s.service), out.seed,
        )  # fmt: skip
        flow.metadata[STREAMED] = True
        failed = [False]

        def stream(chunk: bytes) -> bytes:
            if failed[0]:
                return b""
            try:
                if chunk:
                    return resigner.feed(chunk)
                resigner.finish()
                return b""
            except SigV4Error as e:
                failed[0] = True
                flow.metadata[facts.DECISION] = deny(Reason(e.reason), e.message)
                facts.log.warning("request %s: %s; connection closed", flow.id, e.reason)
                from addons.substitute import _close

                _close(flow)
                return b""

        flow.request.stream = stream

    def _refuse(self, flow: http.HTTPFlow, e: SigV4Error) -> None:
        facts.refuse(flow, deny(Reason(e.reason), e.message))
