"""Token minting (credential kind ``oauth_client``): surrogate obtains the access token itself.

A credential of kind ``oauth_client`` holds a long-lived secret (its ``value``: a client secret,
or a PEM private key for a JWT assertion) and a :class:`MintSpec`. The proxy asks the token
endpoint for an access token (RFC 6749 §4.4 ``client_credentials``, §6 ``refresh_token``, or
RFC 7523 §2.1 ``jwt_bearer``), keeps it in the credential's :class:`TokenSlot` until
:data:`MintSpec.margin` seconds before it expires, and injects it (``Authorization: Bearer
{value}`` unless the credential says otherwise) into requests toward the credential's hosts,
whatever the sandbox sent (an injection: the sandbox holds at most the placeholder).

Client authentication at the token endpoint (``client_auth``): ``secret_basic`` (RFC 6749
§2.3.1, HTTP Basic with the form-encoded id and secret), ``secret_post`` (the same in the
form), ``private_key_jwt`` (RFC 7523 §2.2: a ``client_assertion`` JWT signed with the private
key). The ``jwt_bearer`` grant signs the grant's own ``assertion`` (RFC 7523 §2.1) with the
private key; its claims (:func:`assertion_claims`): ``iss`` the client id, ``sub`` the
``subject`` (default: the client id), ``aud`` the ``audience`` (default: the token URL), ``iat``,
``exp`` (``iat`` + 300 s) and a fresh ``jti`` (RFC 7519 §4.1).

Pure: the clock (``now``) and the JWT's ``jti`` are passed in; signing and HTTP are the
caller's (addons/mint.py). A token endpoint's answer is read by :func:`parse_token_response`;
a failure becomes :class:`MintError`, whose ``code`` holds the endpoint's HTTP status and its
OAuth ``error`` code (RFC 6749 §5.2) only, never its body (which may hold secrets).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote, urlencode, urlsplit

from proxy.core.errors import SecretUnavailable, SurrogateError
from proxy.core.secrets import Secret


class SecretSource(Protocol):
    """Where a value is read (proxy.core.policy.SecretSource; repeated here: no import circle)."""

    def current(self) -> tuple[Secret, int]: ...


class RefreshKeeper(Protocol):
    """Where a credential's refresh token lives beyond this process (the store, for a credential
    the control API wrote): the newest one any worker kept, and keeping a rotated one."""

    def latest(self) -> Secret | None: ...
    def keep(self, token: Secret) -> None: ...
    def hold(self) -> AbstractContextManager[bool]:
        """One minter at a time (across processes): True when held, False when waited out."""
        ...


GRANTS = ("client_credentials", "refresh_token", "jwt_bearer")
CLIENT_AUTHS = ("secret_basic", "secret_post", "private_key_jwt", "none")
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"  # RFC 7523 §2.1
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"  # RFC 7523 §2.2
ALGORITHMS = ("RS256", "ES256", "PS256", "EdDSA")
DEFAULT_MARGIN = 30.0  # seconds before expiry a token is no longer used
DEFAULT_LIFETIME = 300.0  # a token without expires_in is kept this long (RFC 6749 §5.1 lets it be absent)
ASSERTION_LIFETIME = 300  # seconds a JWT assertion is valid
_KEPT = 8  # earlier tokens kept for scrubbing
MAX_BODY = 64 * 1024  # a token response past this is refused
# The OAuth ``error`` codes a token endpoint may answer that the refusal and the log repeat: RFC
# 6749 §5.2 and the IANA "OAuth Extensions Error" registry entries for the token endpoint (RFC
# 8628 §3.5, RFC 8707 §2, RFC 9449 §12). Any other value (a hostile endpoint can answer its
# ``error`` with the client secret, the refresh token or the assertion it was sent, all within
# §5.2's charset) is shown as ``unregistered``: deny by default, never the value.
OAUTH_ERRORS = frozenset({
    "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client",
    "unsupported_grant_type", "invalid_scope", "invalid_target", "access_denied",
    "authorization_pending", "slow_down", "expired_token", "server_error",
    "temporarily_unavailable", "invalid_dpop_proof", "use_dpop_nonce",
})  # fmt: skip
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")  # RFC 6749 §3.3 scope-token


class MintError(SurrogateError):
    """A token could not be minted. ``code`` is safe to show and audit: ``http_<status>``,
    ``http_<status>:<oauth error>``, or a fixed word (``unreachable``, ``bad_response``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class TokenURL:
    host: str
    port: int
    path: str  # path and query, as sent

    @classmethod
    def parse(cls, url: str) -> TokenURL:
        """An ``https://`` URL without userinfo or fragment; raises ValueError naming the problem."""
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise ValueError("token_url must be an https:// URL (the secret travels over verified TLS only)")
        if parts.username is not None or parts.password is not None or parts.fragment:
            raise ValueError("token_url must not carry userinfo or a fragment")
        if not parts.hostname:
            raise ValueError("token_url has no host")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.hostname.lower(), parts.port or 443, path)

    def __str__(self) -> str:
        port = "" if self.port == 443 else f":{self.port}"
        return f"https://{self.host}{port}{self.path}"


@dataclass(frozen=True, slots=True)
class MintSpec:
    token_url: TokenURL
    client_id: str
    grant: str = "client_credentials"
    client_auth: str = "secret_basic"
    scopes: tuple[str, ...] = ()
    audience: str | None = None  # the JWT's aud, and an ``audience`` form field when set
    subject: str | None = None  # jwt_bearer: the assertion's sub (default: client id)
    algorithm: str = "RS256"
    margin: float = DEFAULT_MARGIN

    @property
    def signs_jwt(self) -> bool:
        """True when the credential's value is a private key (a JWT is signed per token request)."""
        return self.grant == "jwt_bearer" or self.client_auth == "private_key_jwt"


@dataclass(frozen=True, slots=True)
class Token:
    value: Secret = field(repr=False)
    expires_at: float
    refresh_token: Secret | None = field(default=None, repr=False)  # a rotated refresh token


@dataclass(slots=True)
class TokenSlot:
    """The token a credential injects (filled by the minter, read as the credential's value
    source). ``generation`` counts tokens minted; it is the credential's version."""

    token: Token | None = field(default=None, repr=False)
    generation: int = 0
    refresh_token: Secret | None = field(default=None, repr=False)  # the newest one (rotation)
    # what response scrubbing must still catch besides the token: earlier tokens, refresh
    # tokens, and the values minted with (proxy.store.live reads :meth:`previous`)
    old: list[Secret] = field(default_factory=list, repr=False)
    also: tuple[SecretSource, ...] = field(default=(), repr=False)
    # the minter's own state, kept here so it lives exactly as long as the credential (a reload
    # builds new slots): its single-flight lock, and the last failure (time, MintError)
    guard: object = field(default=None, repr=False)
    failed: tuple[float, MintError] | None = field(default=None, repr=False)

    def previous(self, since: float) -> list[Secret]:
        """Live values besides the current token (``since`` is unused: tokens kept are few)."""
        out = list(self.old)
        for source in self.also:
            with contextlib.suppress(SecretUnavailable):
                out.append(source.current()[0])
        if self.refresh_token is not None:
            out.append(self.refresh_token)
        return out

    def current(self) -> tuple[Secret, int]:
        if self.token is None:
            raise SecretUnavailable("no access token has been minted yet")
        return self.token.value, self.generation

    def store(self, token: Token) -> None:
        if self.token is not None:
            self.old = [self.token.value, *self.old][:_KEPT]
        if self.refresh_token is not None and token.refresh_token is not None:
            self.old = [self.refresh_token, *self.old][:_KEPT]
        self.token = token
        self.generation += 1
        if token.refresh_token is not None:
            self.refresh_token = token.refresh_token

    def drop(self, generation: int) -> bool:
        """Forget the token of ``generation`` (the API refused it with 401); False when a newer
        one is already held (so a burst of 401s on one token causes one mint, not many)."""
        if self.token is None or generation != self.generation:
            return False
        self.token = None
        return True


@dataclass(frozen=True, slots=True)
class Minting:
    """What a credential of kind ``oauth_client`` mints with: the spec, the long-lived secret
    (client secret or private key), the first refresh token (grant ``refresh_token``), and the
    slot the minted token lives in (which is also the credential's value source)."""

    spec: MintSpec
    secret: SecretSource = field(repr=False)
    refresh: SecretSource | None = field(default=None, repr=False)
    slot: TokenSlot = field(default_factory=TokenSlot, repr=False, compare=False)
    # a store credential's refresh tokens persist (a rotated one survives a restart, and every
    # worker reads the newest); None: rules-file credentials keep a rotated one in memory
    kept: RefreshKeeper | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.slot.also = (self.secret,) + ((self.refresh,) if self.refresh is not None else ())

    def refresh_token(self) -> Secret | None:
        """The newest refresh token: the store's when it keeps them (another worker may have
        rotated it), else one the endpoint rotated in, else the configured one."""
        if self.kept is not None:
            with contextlib.suppress(SecretUnavailable):  # the store fails: this process's newest
                if (latest := self.kept.latest()) is not None:
                    return latest
        if self.slot.refresh_token is not None:
            return self.slot.refresh_token
        return self.refresh.current()[0] if self.refresh is not None else None


def fresh(token: Token | None, now: float, margin: float) -> bool:
    """True when ``token`` may still be injected at ``now`` (``margin`` seconds before expiry)."""
    return token is not None and now < token.expires_at - margin


def problems(spec: MintSpec) -> list[tuple[str, str]]:
    """What is wrong with ``spec``, as (field, sentence) pairs; empty when it is usable."""
    out = []
    if spec.grant not in GRANTS:
        out.append(("grant", f"unknown grant {spec.grant!r}; expected one of: {', '.join(GRANTS)}"))
    if spec.client_auth not in CLIENT_AUTHS:
        out.append(
            (
                "client_auth",
                f"unknown client_auth {spec.client_auth!r}; expected one of: {', '.join(CLIENT_AUTHS)}",
            )
        )
    if spec.algorithm not in ALGORITHMS:
        out.append(
            ("algorithm", f"unknown algorithm {spec.algorithm!r}; expected one of: {', '.join(ALGORITHMS)}")
        )
    if not spec.client_id or any(ord(c) < 32 or ord(c) == 127 for c in spec.client_id):
        out.append(("client_id", "client_id must be non-empty and free of control characters"))
    for s in spec.scopes:
        if not _SCOPE.match(s):
            out.append(("scopes", f"scope {s!r} is not an RFC 6749 §3.3 scope token"))
    if not 0 <= spec.margin < 3600:
        out.append(("margin", "margin must be between 0 and 3600 seconds"))
    if spec.grant == "jwt_bearer" and spec.client_auth in ("secret_basic", "secret_post"):
        out.append(
            (
                "client_auth",
                "grant jwt_bearer signs with a private key: use client_auth private_key_jwt or none",
            )
        )
    return out


def assertion_claims(spec: MintSpec, now: float, jti: str) -> dict[str, object]:
    """The claims of the JWT surrogate signs (RFC 7523 §3): for the ``jwt_bearer`` grant's
    assertion and for ``private_key_jwt`` client authentication alike."""
    iat = int(now)
    private_key_jwt = spec.grant != "jwt_bearer"
    return {
        "iss": spec.client_id,
        "sub": spec.client_id if private_key_jwt else (spec.subject or spec.client_id),
        "aud": spec.audience or str(spec.token_url),
        "iat": iat,
        "exp": iat + ASSERTION_LIFETIME,
        "jti": jti,
    }


def token_request(
    spec: MintSpec, secret: Secret, refresh_token: Secret | None, assertion: str | None
) -> tuple[list[tuple[str, str]], bytes]:
    """The token request's headers and form body (RFC 6749 §4.4.2, §6; RFC 7523 §2.1, §2.2).
    ``assertion``: the signed JWT when :attr:`MintSpec.signs_jwt`. Raises MintError when a
    refresh token is needed and none is known."""
    form: list[tuple[str, str]] = []
    if spec.grant == "client_credentials":
        form.append(("grant_type", "client_credentials"))
    elif spec.grant == "refresh_token":
        if refresh_token is None:
            raise MintError("no_refresh_token", "no refresh token is known for this credential")
        form += [("grant_type", "refresh_token"), ("refresh_token", refresh_token.reveal())]
    else:
        assert assertion is not None
        form += [("grant_type", JWT_BEARER), ("assertion", assertion)]
    if spec.scopes:
        form.append(("scope", " ".join(spec.scopes)))
    if spec.audience and spec.grant != "jwt_bearer":
        form.append(("audience", spec.audience))
    headers = [("content-type", "application/x-www-form-urlencoded"), ("accept", "application/json")]
    if spec.client_auth == "secret_basic":
        # RFC 6749 §2.3.1: id and secret are form-encoded before they are joined
        pair = f"{quote(spec.client_id, safe='')}:{quote(secret.reveal(), safe='')}"
        headers.append(("authorization", "Basic " + base64.b64encode(pair.encode()).decode()))
    elif spec.client_auth == "secret_post":
        form += [("client_id", spec.client_id), ("client_secret", secret.reveal())]
    elif spec.client_auth == "private_key_jwt" and spec.grant != "jwt_bearer":
        assert assertion is not None
        form += [("client_id", spec.client_id), ("client_assertion_type", ASSERTION_TYPE)]
        form.append(("client_assertion", assertion))
    else:
        form.append(("client_id", spec.client_id))
    return headers, urlencode(form).encode()


def parse_token_response(status: int, content_type: str, body: bytes, now: float) -> Token:
    """The token in a token endpoint's answer (RFC 6749 §5.1), or MintError (§5.2): for an
    error, the code names the status and the OAuth ``error`` code when it is a registered one
    (:data:`OAUTH_ERRORS`; any other value is ``unregistered``)."""
    if len(body) > MAX_BODY:
        raise MintError("bad_response", f"token response is larger than {MAX_BODY} bytes")
    doc: object = None
    if content_type.split(";", 1)[0].strip().lower() in ("application/json", "") or body[:1] == b"{":
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            doc = None
    if not 200 <= status < 300:
        code = f"http_{status}"
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, str):
            code += f":{error}" if error in OAUTH_ERRORS else ":unregistered"
        raise MintError(code, f"token endpoint answered {code.replace('http_', 'HTTP ', 1)}")
    if not isinstance(doc, dict):
        raise MintError("bad_response", "token response is not a JSON object")
    token = doc.get("access_token")
    if not isinstance(token, str) or not token or any(ord(c) < 32 or ord(c) == 127 for c in token):
        raise MintError("bad_response", "token response has no usable access_token")
    kind = doc.get("token_type", "bearer")
    if not isinstance(kind, str) or kind.lower() not in ("bearer", "n_a"):
        raise MintError("bad_response", "token response's token_type is not bearer")
    expires_in = doc.get("expires_in", DEFAULT_LIFETIME)
    if isinstance(expires_in, str) and expires_in.isdigit():  # some endpoints send a string
        expires_in = int(expires_in)
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or expires_in <= 0:
        raise MintError("bad_response", "token response's expires_in is not a positive number")
    refresh = doc.get("refresh_token")
    if refresh is not None and (
        not isinstance(refresh, str) or not refresh or any(ord(c) < 32 for c in refresh)
    ):
        raise MintError("bad_response", "token response's refresh_token is not a string")
    return Token(Secret(token), now + float(expires_in), Secret(refresh) if refresh else None)
