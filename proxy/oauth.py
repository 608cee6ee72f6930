"""OAuth token capture: the real tokens a token endpoint hands out become new versions of the
claim's credentials, and the sandbox gets their placeholders.

A store credential may declare (control API, ``"oauth"`` on PUT)::

    {"token_endpoint": {"host": "auth.example.com", "path": "/oauth/token"},
     "access_token": "<credential name>", "id_token": "<credential name, optional>"}

The declaring credential is the **refresh token**: the sandbox sends its placeholder to the token
endpoint (a form or JSON body; request-body substitution swaps it), and a ``refresh_token`` in
the response becomes its new value. ``access_token`` and ``id_token`` go to the credentials named
(they must exist in the same claim). ``expires_in`` (RFC 6749 §5.1, seconds) sets the access
token credential's expiry. A token field with no credential to receive it is withheld (JSON:
null; form: dropped): the sandbox never holds a real token.

The response (2xx only) is read whole, up to :data:`MAX_BODY` bytes, as JSON
(``application/json``, RFC 6749 §5.1) or a form (``application/x-www-form-urlencoded``, as some
providers answer). Other statuses pass through scrubbed like any response.

Rules-file credentials cannot declare it: their values come from env/file sources the proxy
does not own (it would have to write the operator's files); use a store claim.

Pure; no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from proxy.errors import HostError
from proxy.hosts import canonical_host
from proxy.paths import RequestPath, canonical_path, prefix_problem

TOKEN_FIELDS = ("access_token", "refresh_token", "id_token")
MAX_BODY = 64 * 1024


@dataclass(frozen=True, slots=True)
class OAuthSpec:
    host: str  # canonical
    path: str
    access_token: str | None = None
    id_token: str | None = None

    def matches(self, host: str, path: str | RequestPath) -> bool:
        """``host`` canonical; ``path`` the request target as sent (its query ignored) or its
        canonical identity. Any reading of the path that names the endpoint matches
        (:meth:`proxy.paths.RequestPath.names`: escapes of either case, trailing slash,
        ``;params``, ``//``, case): a spelling the server routes to the endpoint, such as
        ``/%74oken`` for ``/token``, is captured, never passed with real tokens."""
        ident = canonical_path(path) if isinstance(path, str) else path
        return host == self.host and ident.names(self.path)

    def targets(self, declaring: str) -> dict[str, str | None]:
        """Token field → the credential that receives it (None: withheld)."""
        return {"access_token": self.access_token, "refresh_token": declaring, "id_token": self.id_token}

    def to_json(self) -> dict[str, Any]:
        return {
            "token_endpoint": {"host": self.host, "path": self.path},
            "access_token": self.access_token,
            "id_token": self.id_token,
        }


def parse_spec(doc: Any) -> OAuthSpec:
    """Validate an ``oauth`` object; raises ValueError naming the field and what is right."""
    if not isinstance(doc, dict):
        raise ValueError("oauth must be an object with token_endpoint, access_token and id_token")
    unknown = sorted(set(doc) - {"token_endpoint", "access_token", "id_token"})
    if unknown:
        raise ValueError(
            f"oauth: unknown field(s) {', '.join(unknown)}; known: token_endpoint, access_token, id_token"
        )
    endpoint = doc.get("token_endpoint")
    if not isinstance(endpoint, dict) or set(endpoint) != {"host", "path"}:
        raise ValueError('oauth.token_endpoint must be {"host": ..., "path": ...}')
    host, path = endpoint["host"], endpoint["path"]
    if not isinstance(host, str) or not isinstance(path, str) or not path.startswith("/") or "?" in path:
        raise ValueError(
            "oauth.token_endpoint: host must be a host name, path must start with '/' and hold no query"
        )
    if (problem := prefix_problem(path)) is not None:
        raise ValueError(f"oauth.token_endpoint.path {problem}")
    try:
        host = canonical_host(host)
    except HostError as e:
        raise ValueError(f"oauth.token_endpoint.host: {e}") from None
    names = {}
    for field in ("access_token", "id_token"):
        name = doc.get(field)
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"oauth.{field} must be the name of a credential of the same claim, or null")
        names[field] = name
    return OAuthSpec(host, path, names["access_token"], names["id_token"])


class CaptureError(ValueError):
    """The token response cannot be read; the message quotes none of it."""


@dataclass(frozen=True, slots=True)
class TokenResponse:
    kind: str  # "json" or "form"
    doc: dict[str, Any] | list[tuple[str, str]]
    tokens: dict[str, str]  # field → real value, for the fields present
    expires_in: float | None


def read(body: bytes, content_type: str) -> TokenResponse:
    """Parse a token response body; raises :class:`CaptureError`."""
    if len(body) > MAX_BODY:
        raise CaptureError(f"token response over {MAX_BODY} bytes")
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body))
        except (UnicodeDecodeError, ValueError):
            raise CaptureError("token response is not a valid form body") from None
        tokens = {k: v for k, v in pairs if k in TOKEN_FIELDS}
        expires = next((v for k, v in pairs if k == "expires_in"), None)
        return TokenResponse("form", pairs, tokens, _seconds(expires))
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise CaptureError(f"token response ({media or 'no content type'}) is not JSON") from None
    if not isinstance(doc, dict):
        raise CaptureError("token response JSON is not an object")
    tokens = {k: v for k, v in doc.items() if k in TOKEN_FIELDS and isinstance(v, str) and v}
    return TokenResponse("json", doc, tokens, _seconds(doc.get("expires_in")))


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 < seconds < 10 * 365 * 86400 else None


def rewrite(response: TokenResponse, placeholders: dict[str, str | None]) -> bytes:
    """The body with each token field's value replaced by ``placeholders[field]`` (None: withheld)."""
    if response.kind == "form":
        assert isinstance(response.doc, list)
        out = []
        for k, v in response.doc:
            if k in response.tokens:
                if placeholders.get(k) is None:
                    continue
                v = placeholders[k] or ""
            out.append((k, v))
        return urlencode(out).encode()
    assert isinstance(response.doc, dict)
    doc = dict(response.doc)
    for k in response.tokens:
        doc[k] = placeholders.get(k)
    return json.dumps(doc).encode()
