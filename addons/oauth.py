"""oauth: capture the real tokens a token endpoint hands out, hand the sandbox placeholders.

For a response (2xx) to a request whose host and path are the token endpoint a credential of the
claim declares (:mod:`proxy.core.oauth`), the body is read whole as the upstream sent it (decoded
from its Content-Encoding here, within :mod:`proxy.core.decode`'s bounds, and *not* scrubbed: this
addon runs before scrub, whose stream wraps this one and scrubs what it passes on; at most
:data:`proxy.core.oauth.MAX_BODY` bytes), its ``access_token``, ``refresh_token`` and
``id_token`` are written to the store as new versions of the credentials that receive them
(``expires_in`` sets the access token's expiry), and the body goes on with their placeholders
instead. The next request (any tunnel) uses the new values: the registry rebuilds from the store.

A non-2xx answer is read whole too, whatever its Content-Type, and refused if it holds any
token-like field (:func:`proxy.core.oauth.check_other`: JSON, also behind an anti-XSSI prefix,
forms, and a token-like ``name=value`` or ``"name": value`` in any other text); the head of
every answer of a token endpoint is checked before it goes on (a token-like header name, a
``Location`` whose query or fragment holds a token-like field, a field value showing a token-like
``name=value``: :func:`proxy.core.oauth.check_head`), and so are its HTTP/2 trailers when the body
has been read, before mitmproxy sends them.

A refresh token presented anywhere else on its hosts (swapped into a request whose path is not
the declared endpoint: a provider's second token URL, such as Microsoft's ``/oauth2/token``
beside ``/oauth2/v2.0/token``) may be answered with fresh real tokens that no scrubber knows:
every answer to such a request, any status and Content-Type, is read whole and refused when it
holds a token-like field with a value (:func:`proxy.core.oauth.check_other`); nothing is captured there
(declare the endpoint that is used).

Fails closed: a body that is too large, not JSON or a form, holds a token-like field it does not
capture, names a credential the claim does not hold, comes from an endpoint host the credential
is not bound to, or cannot be written to the store is not passed; the connection is closed and the audit
event says ``unscannable_response`` with the reason.
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import http

from addons import facts
from proxy.core import oauth
from proxy.core.decide import Reason, deny
from proxy.core.decode import Unscannable, decoder
from proxy.core.errors import SecretUnavailable, SurrogateError
from proxy.core.policy import Claim, Credential
from proxy.core.secrets import checked_value
from proxy.engine.state import State

_CHECKED = "surrogate.oauth_checked"  # responseheaders read this answer as a token endpoint's


def _fail(flow: http.HTTPFlow, why: str) -> None:
    facts.log.warning(
        "token response of %s not passed: %s", flow.metadata.get(facts.REQUEST_ID, flow.id), why
    )
    flow.metadata[facts.DECISION] = deny(
        Reason.UNSCANNABLE_RESPONSE, f"token response could not be captured: {why}", status=502
    )
    if flow.killable:
        flow.kill()


def _presented(flow: http.HTTPFlow, declaring: tuple[Credential, ...], host: str) -> bool:
    """True when a refresh-token credential (one declaring ``oauth``) was swapped into this
    request, or may still be (its body is still streaming toward a host it is bound to)."""
    used = flow.metadata.get(facts.USED, {})
    streaming = flow.request.timestamp_end is None
    return any(c.name in used or (streaming and c.bound_to(host)) for c in declaring)


class OAuthCapture:
    def __init__(self, state: State) -> None:
        self.state = state

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response, claim, host = flow.response, flow.metadata.get(facts.CLAIM), flow.metadata.get(facts.HOST)
        if response is None or claim is None or host is None or response.status_code == 101:
            return
        path = flow.metadata.get(facts.PATH) or flow.request.path  # the canonical identity (policy)
        cred = next((c for c in claim.oauth if c.oauth and c.oauth.matches(host, path)), None)
        content_type = response.headers.get("content-type", "")
        ok = 200 <= response.status_code < 300
        if cred is None:
            # not the declared endpoint, but the request presented a refresh token: whatever
            # the host answers there (another token URL of the provider) is checked, not captured
            if not _presented(flow, claim.oauth, host):
                return
            ok = False
        try:  # the head goes out before the body is read: a token in it would be past capture
            oauth.check_head(response.headers)
        except oauth.CaptureError as e:
            _fail(flow, str(e))
            return
        flow.metadata[_CHECKED] = True  # its trailers are checked too (response, below)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        decode = decoder(encoding)
        if decode is None:
            _fail(flow, f"no decoder for Content-Encoding {encoding[:40]!r}")
            return
        # sent on decoded (scrub, next, then sees an identity body); its length changes
        for name in ("content-length", "content-encoding"):
            response.headers.pop(name, None)
        if flow.request.http_version.startswith("HTTP/1"):
            response.headers["transfer-encoding"] = "chunked"
        inner = response.stream if callable(response.stream) else (lambda b: b)
        held = bytearray()
        failed = False

        def capture(chunk: bytes) -> list[bytes]:
            nonlocal failed
            got: Any = inner(chunk)
            data = got if isinstance(got, bytes) else b"".join(got)
            if failed:
                return []
            try:
                held.extend(decode(data))
                if len(held) > oauth.MAX_BODY:
                    raise oauth.CaptureError(f"over {oauth.MAX_BODY} bytes")
                if chunk:
                    return []  # the end of the body comes as b""
                body = bytes(held)
                if ok and cred is not None:
                    body = self._capture(claim, cred, body, content_type, host)
                else:
                    oauth.check_other(body, content_type)
            except (oauth.CaptureError, Unscannable, SurrogateError, SecretUnavailable) as e:
                failed = True
                _fail(flow, str(e))
                return []
            return [body] if body else []

        response.stream = capture

    @facts.fail_closed
    def response(self, flow: http.HTTPFlow) -> None:
        """HTTP/2 trailers (RFC 9113 §8.1) come after the body: mitmproxy sends them after this
        hook, so a killed flow never passes them on."""
        response = flow.response
        if response is None or not response.trailers or not flow.metadata.get(_CHECKED):
            return
        try:
            oauth.check_head(response.trailers)
        except oauth.CaptureError as e:
            _fail(flow, f"trailers: {e}")

    def _capture(self, claim: Claim, cred: Credential, body: bytes, content_type: str, host: str) -> bytes:
        assert cred.oauth is not None
        read = oauth.read(body, content_type)
        if not cred.bound_to(host):  # the control API refuses such a declaration; kept closed here
            raise oauth.CaptureError(f"token endpoint host is not one of credential {cred.name!r}'s hosts")
        if not read.tokens:
            return body
        store = self.state.registry.store
        if claim.origin != "store" or store is None:
            raise oauth.CaptureError("token capture needs a claim of the credential store")
        by_name = {c.name: c for c in claim.credentials}
        shown: dict[str, str | None] = {}
        now = time.time()
        for field, target in cred.oauth.targets(cred.name).items():
            if field not in read.tokens:
                continue
            receiver = by_name.get(target) if target else None
            if target is not None and receiver is None:
                raise oauth.CaptureError(
                    f"credential {target!r} (to receive {field}) is not in claim {claim.id!r}"
                )
            if receiver is None:
                shown[field] = None  # no credential receives it: withheld
                continue
            value = checked_value(read.tokens[field], f"the {field} of a token response")
            changes: dict[str, Any] = {"value": value.encode()}
            if field == "access_token" and read.expires_in is not None:
                changes["expires_at"] = now + read.expires_in
            store.patch_credential(claim.id, receiver.name, **changes)
            shown[field] = receiver.placeholder
        facts.log.info(
            "token response captured for claim %s: %s", claim.id,
            ", ".join(f"{f} -> {n}" for f, n in cred.oauth.targets(cred.name).items() if f in read.tokens),
        )  # fmt: skip
        return oauth.rewrite(read, shown)
