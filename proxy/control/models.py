"""The control API's request and response bodies (pydantic), its path and header parameters, and
the conversion of store records into response bodies.

Request models forbid unknown fields (422 ``unknown field``); the patterns here are the schema
the OpenAPI document shows, and :mod:`proxy.control.api` says each one as a sentence when it
fails. Response bodies never hold a credential value, not even a hash.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Header
from fastapi import Path as PathParam
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from proxy.control.checks import Coverage
from proxy.control.kinds import AwsSigV4In, Kind, MintIn, SignIn, describe
from proxy.core import slots
from proxy.core.policy import DEFAULT_SURFACES, SURFACES, Misplaced
from proxy.store.base import ClaimRecord, CredentialRecord

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ClaimId = Annotated[str, PathParam(pattern=ID_PATTERN, description="claim id")]
CredName = Annotated[str, PathParam(pattern=ID_PATTERN, description="credential name")]
IfMatch = Annotated[str | None, Header(pattern=r'^\s*("[0-9]+"|\*)\s*$', description='"<version>" or *')]


PLACEHOLDER_PATTERN = r"^surr_[A-Za-z0-9]{16,64}$"
Host = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\s/:@]+$")]
Value = Annotated[str, Field(min_length=1, max_length=16384, pattern=r"^[^\x00-\x1f\x7f]+$")]
# a credential's value: checked for control characters after parsing (proxy.control.checks), so
# that a PEM private key (kind oauth_client) may keep its line breaks
ValueIn = Annotated[str, Field(min_length=1, max_length=16384)]
_VALUE_DOC = (
    "the secret; write-only. Kind static, hmac: the value; oauth_client: the client secret or PEM "
    "private key; absent for aws_sigv4 (its keys are in aws_sigv4). No control characters (a PEM "
    "private key may keep its line breaks)"
)
MAX_REQUESTS = 10**12  # a budget beyond this is no budget; the store keeps it in a 64-bit integer
_LATEST = datetime(9998, 12, 31, tzinfo=UTC).timestamp()


def _expiry_in_range(t: datetime) -> datetime:
    """1970 to 9998 UTC: a time the store keeps as unix seconds and the API can show again."""
    try:
        ok = 0 <= t.timestamp() <= _LATEST
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError("must be between 1970-01-01T00:00:00Z and 9998-12-31T00:00:00Z")
    return t


Expiry = Annotated[AwareDatetime, AfterValidator(_expiry_in_range)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClaimIn(_In):
    id: str | None = Field(None, pattern=ID_PATTERN, description="claim id; generated when absent")
    pool: str = Field(description="a pool of the rules file")
    sources: list[str] = Field(default_factory=list, description="source addresses/CIDRs (transparent mode)")
    interface: str | None = Field(
        None,
        description="transparent mode: the interface (veth, bridge port) its connections must arrive on; "
        "needs sources (README, 'The fence')",
    )


class InjectIn(_In):
    set_header: str = Field(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", description="an HTTP header name")
    format: str = Field("Bearer {value}", pattern=r"^[^\x00-\x1f\x7f]*\{value\}[^\x00-\x1f\x7f]*$")


SurfaceName = Literal["header", "basic", "query", "userinfo", "body"]
MisplacedAction = Literal["carry", "block", "terminate"]
_SURFACES_DOC = "where the placeholder is swapped (rules/README.md, 'Surfaces'); default [header, basic]"
_MISPLACED_DOC = "a placeholder on a surface not enabled (or in a body toward another host): default carry"
HeaderName = Annotated[str, Field(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", max_length=128)]
BasicPartName = Literal["user", "password"]
_HEADERS_DOC = (
    f"headers the header surface swaps in (proxy/core/slots.py); default {list(slots.DEFAULT_HEADER_NAMES)}"
)
_PARTS_DOC = "parts of Basic credentials the basic surface swaps in; default [password]"


class CredentialPut(_In):
    hosts: list[Host] = Field(min_length=1, description="host patterns the secret may be sent to")
    kind: Kind = Field("static", description="static, aws_sigv4, oauth_client or hmac (control/kinds.py)")
    value: ValueIn | None = Field(None, description=_VALUE_DOC)
    aws_sigv4: AwsSigV4In | None = Field(None, description="kind aws_sigv4: keys (write-only) and scope")
    mint: MintIn | None = Field(None, description="kind oauth_client: how the access token is minted")
    sign: SignIn | None = Field(None, description="kind hmac: what is signed and where it goes")
    placeholder: str | None = Field(None, pattern=PLACEHOLDER_PATTERN, description="generated when absent")
    inject: InjectIn | None = None
    expires_at: Expiry | None = None
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS, description="request budget; absent: none")
    surfaces: list[SurfaceName] | None = Field(None, description=_SURFACES_DOC)
    headers: list[HeaderName] | None = Field(None, max_length=64, description=_HEADERS_DOC)
    basic_parts: list[BasicPartName] | None = Field(None, description=_PARTS_DOC)
    on_misplaced: MisplacedAction | None = Field(None, description=_MISPLACED_DOC)
    oauth: dict[str, Any] | None = Field(
        None,
        description='OAuth token capture (proxy/core/oauth.py): {"token_endpoint": {"host", "path"}, '
        '"access_token": <credential name>, "id_token": <credential name>}; '
        "this credential is the refresh token",
    )


class CredentialPatch(_In):
    hosts: list[Host] | None = Field(None, min_length=1)
    value: ValueIn | None = Field(None, description=_VALUE_DOC + "; kind and its block change by PUT only")
    placeholder: str | None = Field(None, pattern=PLACEHOLDER_PATTERN)
    inject: InjectIn | None = None
    expires_at: Expiry | None = None
    max_requests: int | None = Field(
        None, ge=1, le=MAX_REQUESTS, description="request budget; null removes it"
    )
    surfaces: list[SurfaceName] | None = Field(None, description=_SURFACES_DOC + "; null: the default")
    headers: list[HeaderName] | None = Field(
        None, max_length=64, description=_HEADERS_DOC + "; null: the default"
    )
    basic_parts: list[BasicPartName] | None = Field(None, description=_PARTS_DOC + "; null: the default")
    on_misplaced: MisplacedAction | None = Field(None, description=_MISPLACED_DOC + "; null: carry")


class ClaimOut(BaseModel):
    id: str
    pool: str
    sources: list[str]
    interface: str | None
    version: int
    created_at: datetime
    updated_at: datetime


class ClaimCreated(ClaimOut):
    proxy_token: str = Field(description="shown once: the sandbox's proxy password (user = claim id)")


class InjectOut(BaseModel):
    set_header: str
    format: str


class CoverageOut(BaseModel):
    host: str
    rule: str
    header: str


class CredentialOut(BaseModel):
    claim: str
    name: str
    hosts: list[str]
    placeholder: str
    inject: InjectOut | None
    surfaces: list[str]
    headers: list[str]
    basic_parts: list[str]
    on_misplaced: str
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    max_requests: int | None
    requests_used: int
    kind: str = "static"
    aws_sigv4: dict[str, Any] | None = Field(
        None, description="regions, services and the secret key / session token placeholders; never a key"
    )
    mint: dict[str, Any] | None = Field(None, description="the mint spec; never the secret or refresh token")
    sign: dict[str, Any] | None = Field(None, description="the sign spec; never the secret")


class CredentialWritten(CredentialOut):
    coverage: list[CoverageOut]


class ErrorOut(BaseModel):
    error: str
    message: str
    field: str | None = None


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def claim_out(r: ClaimRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "pool": r.pool,
        "sources": list(r.sources),
        "interface": r.interface,
        "version": r.version,
        "created_at": _ts(r.created_at),
        "updated_at": _ts(r.updated_at),
    }


def credential_out(r: CredentialRecord, cov: list[Coverage] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "claim": r.claim_id,
        "name": r.name,
        "hosts": list(r.hosts),
        "placeholder": r.placeholder,
        "inject": {"set_header": r.inject_header, "format": r.inject_format} if r.inject_header else None,
        "surfaces": list(r.surfaces)
        if r.surfaces is not None
        else [str(s) for s in SURFACES if s in DEFAULT_SURFACES],
        "headers": list(r.headers) if r.headers is not None else list(slots.DEFAULT_HEADER_NAMES),
        "basic_parts": list(r.basic_parts) if r.basic_parts is not None else ["password"],
        "on_misplaced": r.on_misplaced or Misplaced.CARRY.value,
        "version": r.version,
        "created_at": _ts(r.created_at),
        "updated_at": _ts(r.updated_at),
        "expires_at": _ts(r.expires_at),
        "last_used_at": _ts(r.last_used_at),
        "max_requests": r.max_requests,
        "requests_used": r.requests_used,
        **describe(r),
    }
    if cov is not None:
        out["coverage"] = [{"host": c.host, "rule": c.rule, "header": c.header} for c in cov]
    return out
