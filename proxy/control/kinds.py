"""Credential kinds through the control API (issue 15): the request blocks of kinds
``aws_sigv4``, ``oauth_client`` and ``hmac``, their checks, and what the store keeps of them
(proxy.store.kinds: the secrets sealed in the value, the rest a JSON spec).

A PUT names ``kind`` (default ``static``) and the kind's block:

- ``aws_sigv4``: ``{access_key_id, secret_access_key, session_token?, regions, services,
  secret_placeholder?, session_token_placeholder?}``; no ``value`` (the keys are the value, sealed
  as JSON), no ``inject`` and no surfaces (it is re-signed, never swapped). The credential's
  ``placeholder`` is the placeholder access key id; the secret key's (and session token's, when
  there is one) placeholders are generated when absent.
- ``oauth_client``: ``mint`` ``{token_url, client_id, grant, client_auth?, scopes, audience?,
  subject?, algorithm, margin, refresh_token?}`` and ``value`` (the client secret, or the PEM
  private key for a JWT assertion; its newlines may be real or ``\\n``). The token endpoint's host
  must be one of ``hosts`` (and so covered by an intercepting rule); grant ``refresh_token``
  needs ``mint.refresh_token``, sealed apart (credential_tokens) and replaced when the endpoint
  rotates it.
- ``hmac``: ``sign`` (algorithm, parts, separator, encoding, header, format, timestamp_header,
  max_body; proxy.core.hmacsign) and ``value`` (the shared secret); no ``inject``.

Decided: a kind and its block change by PUT only (a PATCH may change the common fields, and the
value of ``oauth_client`` and ``hmac``; an ``aws_sigv4`` credential's keys are its block). Every
refusal is a ControlError naming the field and the shape wanted, never a value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from proxy.control.checks import ControlError, check_value, coverage
from proxy.core import hmacsign, mint, placeholders
from proxy.core.hosts import HostPattern
from proxy.core.policy import Pool
from proxy.store.base import CredentialRecord, CredentialStore
from proxy.store.kinds import parts, spec_json, spec_placeholders

# a bound only (pydantic's regex engine lacks the one scanner's lookahead): the shape is checked
# by placeholders.is_placeholder in _aws, so a template placeholder is taken as in the rules file
_PH = r"^[A-Za-z0-9_-]{16,200}$"
_PRINTABLE = r"^[\x21-\x7e]+$"  # AWS keys and tokens: visible ASCII, no space
_NAME = r"^(\*|[a-z0-9][a-z0-9-]{0,62})$"  # an AWS region or service name, or * for any
_HEADER = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"  # RFC 9110 §5.6.2 token
_TEXT = r"^[^\x00-\x1f\x7f]*$"
Kind = Literal["static", "aws_sigv4", "oauth_client", "hmac"]
AwsName = Annotated[str, Field(pattern=_NAME)]
BLOCKS = {"aws_sigv4": "aws_sigv4", "oauth_client": "mint", "hmac": "sign"}  # kind -> its block
PartName = Literal["timestamp", "method", "path", "query", "body", "body_sha256"]
_DEFAULT_PARTS: list[PartName] = ["timestamp", "method", "path", "query", "body"]  # hmacsign.DEFAULT_PARTS


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AwsSigV4In(_In):
    access_key_id: str = Field(min_length=1, max_length=128, pattern=_PRINTABLE, description="write-only")
    secret_access_key: str = Field(min_length=1, max_length=256, pattern=_PRINTABLE, description="write-only")
    session_token: str | None = Field(None, min_length=1, max_length=8192, pattern=_PRINTABLE,
                                      description="write-only")  # fmt: skip
    regions: list[AwsName] = Field(min_length=1, max_length=64, description="regions it may sign for (* any)")
    services: list[AwsName] = Field(
        min_length=1, max_length=64, description="services it may sign for (* any)"
    )
    secret_placeholder: str | None = Field(None, pattern=_PH, description="generated when absent")
    session_token_placeholder: str | None = Field(
        None, pattern=_PH, description="generated when absent and session_token is given"
    )


class MintIn(_In):
    token_url: str = Field(
        max_length=2048, pattern=r"^https://[^\s]+$", description="https:// token endpoint"
    )
    client_id: str = Field(min_length=1, max_length=512, pattern=_TEXT)
    grant: Literal["client_credentials", "refresh_token", "jwt_bearer"] = "client_credentials"
    client_auth: Literal["secret_basic", "secret_post", "private_key_jwt", "none"] | None = Field(
        None, description="default secret_basic, or private_key_jwt when a JWT is signed"
    )
    scopes: list[str] = Field(default_factory=list, max_length=64)
    audience: str | None = Field(None, max_length=2048, pattern=_TEXT)
    subject: str | None = Field(None, max_length=2048, pattern=_TEXT)
    algorithm: Literal["RS256", "ES256", "PS256", "EdDSA"] = "RS256"
    margin: float = Field(mint.DEFAULT_MARGIN, ge=0, lt=3600, description="seconds before expiry")
    refresh_token: str | None = Field(
        None, min_length=1, max_length=16384, pattern=r"^[^\x00-\x1f\x7f]+$",
        description="grant refresh_token: the first refresh token; write-only",
    )  # fmt: skip


class SignIn(_In):
    algorithm: Literal["hmac-sha256", "hmac-sha512"] = "hmac-sha256"
    parts: list[PartName] = Field(default_factory=lambda: list(_DEFAULT_PARTS), min_length=1, max_length=6)
    separator: str = Field("", max_length=16, pattern=_TEXT)
    encoding: Literal["hex", "base64"] = "hex"
    header: str = Field("X-Signature", max_length=128, pattern=_HEADER)
    format: str = Field("{signature}", max_length=256, pattern=_TEXT)
    timestamp_header: str = Field("X-Timestamp", max_length=128, pattern=_HEADER)
    max_body: int = Field(hmacsign.MAX_BODY, ge=0, le=16 * hmacsign.MAX_BODY)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What the store is given for a PUT of a kind: the sealed value, the spec, the refresh token."""

    kind: str
    value: bytes
    spec: str | None
    refresh_token: bytes | None


def _refuse(field: str, message: str, code: str = "invalid_kind") -> ControlError:
    return ControlError(422, code, message, field)


def prepare(pool: Pool, body: dict[str, Any]) -> Prepared:
    """Check a PUT body's kind and block against ``pool`` and make what the store keeps.
    Raises ControlError(422) naming the field."""
    kind: str = body.get("kind") or "static"
    blocks = {"aws_sigv4": body.get("aws_sigv4"), "mint": body.get("mint"), "sign": body.get("sign")}
    own = BLOCKS.get(kind)
    for name, block in blocks.items():
        if block is not None and name != own:
            wanted = next(k for k, v in BLOCKS.items() if v == name)
            raise _refuse(name, f"{name} is for kind {wanted}; this credential is of kind {kind}")
    if kind != "static" and body.get("oauth") is not None:
        raise _refuse(
            "oauth", "oauth (token capture) is for kind static: this credential is minted or signed"
        )
    if kind == "hmac" and blocks["sign"] is None:
        blocks["sign"] = {}  # the documented example scheme, as a rules file's hmac without sign
    if own is not None and blocks[own] is None:
        raise _refuse(own, f"kind {kind} needs its {own} block")
    if kind != "static" and body.get("inject_header") is not None and kind != "oauth_client":
        raise _refuse("inject", f"kind {kind} sets its own headers (it is signed): remove inject")
    if kind == "aws_sigv4":
        return _aws(body, AwsSigV4In.model_validate(blocks["aws_sigv4"]))
    if body.get("value") is None:
        raise ControlError(
            422, "invalid_request", f"value: kind {kind} needs a value (1-16384 characters)", "value"
        )
    if kind == "static":
        return Prepared(kind, check_value(body["value"]), None, None)
    if kind == "hmac":
        sign = SignIn.model_validate(blocks["sign"])
        doc = sign.model_dump()
        for name in ("header", "timestamp_header"):
            low = doc[name].lower()
            if low in ("host", "content-length") or low.startswith("proxy-"):
                raise _refuse(f"sign.{name}", f"sign.{name} must be a header surrogate may set (not {low})")
        _parsed("sign", kind, doc)
        return Prepared(kind, check_value(body["value"]), spec_json(doc), None)
    return _oauth(pool, body, MintIn.model_validate(blocks["mint"]))


def _parsed(block: str, kind: str, doc: dict[str, Any]) -> None:
    try:
        parts(kind, doc)
    except ValueError as e:
        field, _, why = str(e).partition(": ")
        raise _refuse(field if why else block, why or str(e)) from None


def _aws(body: dict[str, Any], aws: AwsSigV4In) -> Prepared:
    if body.get("value") is not None:
        raise _refuse(
            "value", "kind aws_sigv4 takes its keys in aws_sigv4 (access_key_id, secret_access_key)"
        )
    for name in ("surfaces", "headers", "basic_parts"):
        if body.get(name) is not None:
            raise _refuse(name, f"kind aws_sigv4 is re-signed, never swapped: remove {name}")
    for field, given_ph in (
        ("secret_placeholder", aws.secret_placeholder),
        ("session_token_placeholder", aws.session_token_placeholder),
    ):
        if given_ph is not None and not placeholders.is_placeholder(given_ph):
            raise _refuse(
                f"aws_sigv4.{field}", f"{field} must be {placeholders.FORMATS}", "invalid_placeholder"
            )
    secret_ph = aws.secret_placeholder or placeholders.generate()
    token_ph = aws.session_token_placeholder or (placeholders.generate() if aws.session_token else None)
    if token_ph is not None and aws.session_token is None:
        raise _refuse("aws_sigv4.session_token_placeholder", "session_token_placeholder needs session_token")
    mine = [body.get("placeholder"), secret_ph, token_ph]
    given = [p for p in mine if p is not None]
    if len(set(given)) != len(given):
        raise _refuse("aws_sigv4.secret_placeholder", "the access key id, secret key and session token "
                      "placeholders must differ from each other")  # fmt: skip
    keys = {"access_key_id": aws.access_key_id, "secret_access_key": aws.secret_access_key}
    if aws.session_token is not None:
        keys["session_token"] = aws.session_token
    doc = {"regions": sorted(set(aws.regions)), "services": sorted(set(aws.services)),
           "secret_placeholder": secret_ph, "session_token_placeholder": token_ph}  # fmt: skip
    return Prepared("aws_sigv4", json.dumps(keys).encode(), spec_json(doc), None)


def _oauth(pool: Pool, body: dict[str, Any], m: MintIn) -> Prepared:
    doc = m.model_dump(exclude={"refresh_token"})
    _parsed("mint", "oauth_client", doc)
    url = mint.TokenURL.parse(m.token_url)
    if not any(HostPattern.parse(h).matches(url.host) for h in body["hosts"]):
        raise _refuse(
            "mint.token_url",
            f"token endpoint host {url.host} is not one of the credential's hosts; add it to hosts "
            "(the client secret goes only to hosts the credential is bound to)",
            "mint_host_not_bound",
        )
    try:
        coverage(pool, [url.host], None)
    except ControlError as e:
        raise ControlError(e.status, e.code, e.message, "mint.token_url") from None
    if (m.grant == "refresh_token") != (m.refresh_token is not None):
        raise _refuse(
            "mint.refresh_token", "mint.refresh_token is needed by, and only by, grant refresh_token"
        )
    text: str = body["value"]
    signs = m.grant == "jwt_bearer" or m.client_auth == "private_key_jwt"
    if signs:
        text = text.replace("\r\n", "\n").strip().replace("\n", "\\n")  # kept on one line, as in files
        if (why := _key_problem(text, m.algorithm)) is not None:
            raise ControlError(422, "invalid_value", why, "value")
    refresh = check_value(m.refresh_token) if m.refresh_token is not None else None
    return Prepared("oauth_client", check_value(text), spec_json(doc), refresh)


def _key_problem(value: str, algorithm: str) -> str | None:
    """None when ``value`` is a PEM private key; else why (never the value)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        load_pem_private_key(value.replace("\\n", "\n").encode(), password=None)
    except (ValueError, TypeError):
        return f"value must be a PEM private key (unencrypted) for {algorithm} JWT assertions"
    return None


def check_patch(old: CredentialRecord, changes: dict[str, Any]) -> None:
    """A PATCH of a credential of another kind than static changes what its kind allows."""
    if old.kind == "static":
        return
    if old.kind == "aws_sigv4" and "value" in changes:
        raise _refuse("value", "an aws_sigv4 credential's keys change with a PUT of its aws_sigv4 block")
    if old.kind in ("aws_sigv4", "hmac") and changes.get("inject_header") is not None:
        raise _refuse("inject", f"kind {old.kind} sets its own headers (it is signed): remove inject")
    if old.kind == "aws_sigv4" and any(
        changes.get(k) is not None for k in ("surfaces", "headers", "basic_parts")
    ):
        raise _refuse("surfaces", "kind aws_sigv4 is re-signed, never swapped")
    if old.kind == "oauth_client" and "hosts" in changes and old.spec is not None:
        url = mint.TokenURL.parse(json.loads(old.spec)["token_url"])
        if not any(HostPattern.parse(h).matches(url.host) for h in changes["hosts"]):
            raise _refuse(
                "hosts", f"hosts must keep the token endpoint host {url.host}", "mint_host_not_bound"
            )
    if old.kind == "oauth_client" and isinstance(changes.get("value"), str):
        doc = json.loads(old.spec or "{}")
        if doc.get("grant") == "jwt_bearer" or doc.get("client_auth") == "private_key_jwt":
            text = changes["value"].replace("\r\n", "\n").strip().replace("\n", "\\n")
            if (why := _key_problem(text, str(doc.get("algorithm")))) is not None:
                raise ControlError(422, "invalid_value", why, "value")
            changes["value"] = text


def check_placeholders(
    store: CredentialStore,
    claim_id: str,
    name: str,
    placeholder: str | None,
    kind: str | None,
    spec: str | None,
) -> None:
    """The placeholders of credential ``name`` (its own, and an aws_sigv4 spec's) are used by no
    other credential of the claim: 409 naming the one that has it. Indexed lookups in the store
    (``placeholder_holder``), not a read of the claim: a PUT costs the same at 10 credentials and
    at 10,000. An early answer only: the store checks again inside the write's transaction."""
    mine = ({placeholder} if placeholder else set()) | spec_placeholders(kind, spec)
    if mine and (found := store.placeholder_holder(claim_id, name, mine)):
        why = f"placeholder {found[0]} is already used by credential {found[1]!r}"
        raise ControlError(409, "conflict", why, "placeholder")


def describe(r: CredentialRecord) -> dict[str, Any]:
    """The response fields of a credential's kind: ``kind`` and its block without a secret."""
    doc: dict[str, Any] = json.loads(r.spec) if r.spec else {}
    out: dict[str, Any] = {"kind": r.kind, "aws_sigv4": None, "mint": None, "sign": None}
    if r.kind != "static":
        out[BLOCKS[r.kind]] = doc
    return out
