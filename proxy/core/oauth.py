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

Fails closed on what it does not recognise: a *token-like* field anywhere else in the document
(a key whose last word is token, secret, key, password, jwt or assertion, in any case or
spelling: ``authed_user.access_token`` nested in an object or a list, ``ID_Token``,
``idToken``, ``bot_token``, ``client_secret``), a recognised field whose value is not a string,
or a name given twice (a form's recognised field, a form's token-like field, any JSON member),
refuses the response (:class:`CaptureError`): surrogate cannot tell where such a value may go,
so it hands the sandbox neither the value nor a guess. Every answer that is not captured (a
non-2xx, whatever its Content-Type, or one where a refresh token was presented elsewhere) is
checked the same way, body and head (:func:`check_other`, :func:`check_head`: no token-like
field, header name or ``Location`` field may pass), and otherwise passes, scrubbed, unchanged.

The token endpoint's host must be one of the declaring credential's hosts (so covered by an
intercepting rule of the pool): :func:`endpoint_bound`, checked by the control API when the
credential is written and again at capture. Capture reads the upstream's body as it arrived
(decoded from its Content-Encoding, never scrubbed): scrubbing first would turn a refresh token
the endpoint hands back unchanged into its own placeholder, and store that as the value.

The response (2xx only) is read whole, up to :data:`MAX_BODY` bytes, as JSON
(``application/json``, RFC 6749 §5.1) or a form (``application/x-www-form-urlencoded``, as some
providers answer).

Rules-file credentials cannot declare it: their values come from env/file sources the proxy
does not own (it would have to write the operator's files); use a store claim.

Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from proxy.core.errors import HostError
from proxy.core.hosts import HostPattern, canonical_host
from proxy.core.paths import RequestPath, canonical_path, prefix_problem

TOKEN_FIELDS = ("access_token", "refresh_token", "id_token")
MAX_BODY = 64 * 1024
# A key is token-like when its last word (split on non-letters/digits and camelCase) ends so.
_TOKEN_LIKE = ("token", "tokens", "secret", "secrets", "key", "keys", "password", "jwt", "assertion")
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SAFE_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")


def token_like(key: str) -> bool:
    """True when ``key`` names what is probably a credential (``authed_user``'s ``access_token``,
    ``idToken``, ``ID_TOKEN``, ``client_secret``, ``api_key``); ``token_type`` and
    ``refresh_token_expires_in`` are not."""
    if not key.isascii():
        return True  # decided: a look-alike letter (Cyrillic е in ``id_tokеn``) spells any of these
    words = _WORDS.findall(key)
    return bool(words) and words[-1].lower().endswith(_TOKEN_LIKE)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` object hook: a name given twice is refused (RFC 8259 §4 leaves its meaning
    to the parser; the last one wins in Python, so ``{"bot_token": "<real>", "bot_token": ""}``
    would read as empty and pass the real value on)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise CaptureError("token endpoint answer gives a JSON member name more than once")
    return doc


def _form_doc(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """A form's fields by name, every value of a repeated name kept (a list): ``a=<real>&a=``
    holds a value, whichever occurrence a reader takes."""
    grouped: dict[str, list[str]] = {}
    for k, v in pairs:
        grouped.setdefault(k, []).append(v)
    return {k: vs[0] if len(vs) == 1 else vs for k, vs in grouped.items()}


# An answer that parses as neither JSON nor a form (text/plain, HTML, JSON behind an anti-XSSI
# prefix such as ``)]}'``): a token-like name, then ``:`` or ``=`` and the start of a value.
_TEXT_FIELD = re.compile(
    rb"(?i)(?:token|tokens|secret|secrets|key|keys|password|jwt|assertion)[\"']?\s*[:=]\s*[\"']?"
    rb"(?![\"'\s&,;}<]|null\b)"
)
_XSSI = re.compile(rb"^\s*(?:\)\]\}'|while\s*\(1\);|for\s*\(;;\);)\s*,?")


def _holds_value(value: Any) -> bool:
    """null, booleans and empty strings carry no secret; anything else may."""
    return not (value is None or isinstance(value, bool) or value == "")


def _show(path: list[str]) -> str:
    """A field path for a message: key names only when they look like names (never a value)."""
    out = ""
    for p in path:
        if p.startswith("[") and p[1:-1].isdigit():
            out += p
        else:
            out += ("." if out else "") + (p if _SAFE_KEY.match(p) else "<field>")
    return out


def _unrecognised(doc: Any, path: list[str], top: bool) -> Iterator[str]:
    """Paths of token-like fields holding a value, except the recognised top-level string ones
    (``top``: ``doc`` is the response object itself)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            key = str(k)
            here = [*path, key]
            if top and key in TOKEN_FIELDS:
                if _holds_value(v) and not isinstance(v, str):
                    yield _show(here) + " (not a string)"
                continue
            if token_like(key) and _holds_value(v):
                yield _show(here)
            yield from _unrecognised(v, here, False)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _unrecognised(v, [*path, f"[{i}]"], False)


def _refuse_unrecognised(doc: Any) -> None:
    found = list(dict.fromkeys(_unrecognised(doc, [], True)))
    if found:
        raise CaptureError(
            f"token response holds token-like field(s) surrogate does not capture: {', '.join(found[:5])}"
        )


def endpoint_bound(spec: OAuthSpec, hosts: tuple[HostPattern, ...] | list[HostPattern]) -> bool:
    """True when the token endpoint's host is one of the credential's host patterns."""
    return any(p.matches(spec.host) for p in hosts)


@dataclass(frozen=True, slots=True)
class OAuthSpec:
    host: str  # canonical
    path: str
    access_token: str | None = None
    id_token: str | None = None

    def matches(self, host: str, path: str | RequestPath) -> bool:
        """``host`` canonical; ``path`` the request target as sent (its query ignored) or its
        canonical identity. Any reading of the path that names the endpoint matches
        (:meth:`proxy.core.paths.RequestPath.names`: escapes of either case, trailing slash,
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
        twice = sorted({k for k, _ in pairs if k in TOKEN_FIELDS and sum(1 for j, _ in pairs if j == k) > 1})
        if twice:
            raise CaptureError(f"token response gives {', '.join(twice)} more than once")
        _refuse_unrecognised(_form_doc([(k, v) for k, v in pairs if k not in TOKEN_FIELDS]))
        tokens = {k: v for k, v in pairs if k in TOKEN_FIELDS}
        expires = next((v for k, v in pairs if k == "expires_in"), None)
        return TokenResponse("form", pairs, tokens, _seconds(expires))
    try:
        doc = json.loads(body, object_pairs_hook=_unique_keys)
    except CaptureError:
        raise
    except (UnicodeDecodeError, ValueError):
        raise CaptureError(f"token response ({media or 'no content type'}) is not JSON") from None
    if not isinstance(doc, dict):
        raise CaptureError("token response JSON is not an object")
    _refuse_unrecognised(doc)
    tokens = {k: v for k, v in doc.items() if k in TOKEN_FIELDS and isinstance(v, str) and v}
    return TokenResponse("json", doc, tokens, _seconds(doc.get("expires_in")))


def check_other(body: bytes, content_type: str) -> None:
    """An answer of a token endpoint that is not captured (a non-2xx, or any answer where a
    refresh token was presented outside the declared endpoint): raises :class:`CaptureError` when
    its body holds any token-like field with a value (recognised ones included: nothing is
    captured from an error), whatever its Content-Type says. The body is read as a form (when so
    labelled), else as JSON (also behind an anti-XSSI prefix), else as a form; a body that is
    none of these (text, HTML) is refused when it shows a token-like name followed by ``:`` or
    ``=`` and a value (``access_token=…``, ``"id_token": "…"``), so an error page that says
    ``token: expired`` is refused too (decided: fail closed at a token endpoint)."""
    if len(body) > MAX_BODY:
        raise CaptureError(f"token endpoint answer over {MAX_BODY} bytes")
    media = content_type.split(";", 1)[0].strip().lower()
    doc = _parsed(body, media)
    if doc is None:
        if _TEXT_FIELD.search(body):
            raise CaptureError(
                "token endpoint answer shows a token-like field in a body that is not JSON or a form"
            )
        return
    found = list(dict.fromkeys(_unrecognised(doc, [], False)))
    if found:
        raise CaptureError(f"token endpoint error answer holds token-like field(s): {', '.join(found[:5])}")


def _parsed(body: bytes, media: str) -> Any:
    """The body as a form (labelled so), JSON (bare or behind an anti-XSSI prefix), or a strict
    form; None when it is none of them. Raises :class:`CaptureError` for a repeated JSON name."""
    if media == "application/x-www-form-urlencoded":
        try:
            return _form_doc(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except (UnicodeDecodeError, ValueError):
            return None
    for text in (body, _XSSI.sub(b"", body, count=1)):
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except CaptureError:
            raise
        except (UnicodeDecodeError, ValueError):
            continue
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return None
    return _form_doc(pairs) if pairs else None


def check_head(headers: Any) -> None:
    """The head (or the trailers, RFC 9110 §6.5) of a token endpoint's answer, before it goes
    on: raises :class:`CaptureError` when a field's name is token-like (``X-Access-Token``), a
    field's value shows a token-like name followed by ``=`` or ``:`` and a value, as written or
    percent-decoded (``Set-Cookie: access_token=…``, ``Refresh: 0; url=…#id_token=…``), or a
    ``Location`` (RFC 9110 §10.2.2) carries a token-like field with a value in its query or
    fragment (the implicit grant's ``#access_token=…``, RFC 6749 §4.2.2). ``headers``:
    mitmproxy's ``Headers``. Tokens are captured from the body only (RFC 6749 §5.1); a provider
    that hides one elsewhere (a cookie of another name, an encoding) is beyond what capture can
    tell from any other value."""
    named = sorted({k.lower() for k in headers if token_like(k)})
    if named:
        raise CaptureError(f"token endpoint answer carries token-like field(s): {', '.join(named[:5])}")
    for value in headers.values():
        texts = (value, unquote(value))
        if any(_TEXT_FIELD.search(t.encode("utf-8", "surrogateescape")) for t in texts):
            raise CaptureError("a field value of the token endpoint answer shows a token-like field")
    for location in headers.get_all("location"):
        url = urlsplit(location)
        fields = parse_qsl(f"{url.query}&{url.fragment}", keep_blank_values=True)
        if any(value and token_like(name) for name, value in fields):
            raise CaptureError("token endpoint answer's Location carries a token-like field")


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
