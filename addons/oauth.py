"""oauth: capture the real tokens a token endpoint hands out, hand the sandbox placeholders.

For a response (2xx) to a request whose host and path are the token endpoint a credential of the
claim declares (:mod:`proxy.oauth`), the body is read whole (after scrub decoded and scrubbed
it; at most :data:`proxy.oauth.MAX_BODY` bytes), its ``access_token``, ``refresh_token`` and
``id_token`` are written to the store as new versions of the credentials that receive them
(``expires_in`` sets the access token's expiry), and the body goes on with their placeholders
instead. The next request (any tunnel) uses the new values: the registry rebuilds from the store.

Fails closed: a body that is too large, not JSON or a form, names a credential the claim does not
hold, or cannot be written to the store is not passed; the connection is closed and the audit
event says ``unscannable_response`` with the reason.
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import http

from addons import facts
from proxy import oauth
from proxy.decide import Reason, deny
from proxy.errors import SecretUnavailable, SurrogateError
from proxy.policy import Claim, Credential
from proxy.secrets import checked_value
from proxy.state import State


def _fail(flow: http.HTTPFlow, why: str) -> None:
    facts.log.warning(
        "token response of %s not passed: %s", flow.metadata.get(facts.REQUEST_ID, flow.id), why
    )
    flow.metadata[facts.DECISION] = deny(
        Reason.UNSCANNABLE_RESPONSE, f"token response could not be captured: {why}", status=502
    )
    if flow.killable:
        flow.kill()


class OAuthCapture:
    def __init__(self, state: State) -> None:
        self.state = state

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response, claim, host = flow.response, flow.metadata.get(facts.CLAIM), flow.metadata.get(facts.HOST)
        if response is None or claim is None or host is None or not 200 <= response.status_code < 300:
            return
        path = flow.metadata.get(facts.PATH) or flow.request.path  # the canonical identity (policy)
        cred = next((c for c in claim.oauth if c.oauth and c.oauth.matches(host, path)), None)
        if cred is None:
            return
        content_type = response.headers.get("content-type", "")
        response.headers.pop("content-length", None)
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
            held.extend(data)
            if len(held) > oauth.MAX_BODY:
                failed = True
                _fail(flow, f"over {oauth.MAX_BODY} bytes")
                return []
            if chunk:
                return []  # the end of the body comes as b""
            try:
                body = self._capture(claim, cred, bytes(held), content_type)
            except (oauth.CaptureError, SurrogateError, SecretUnavailable) as e:
                failed = True
                _fail(flow, str(e))
                return []
            return [body] if body else []

        response.stream = capture

    def _capture(self, claim: Claim, cred: Credential, body: bytes, content_type: str) -> bytes:
        assert cred.oauth is not None
        read = oauth.read(body, content_type)
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
