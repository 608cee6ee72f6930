"""The control API: JSON over HTTP (FastAPI), OpenAPI document at ``/openapi.json``.

    GET    /healthz                                   liveness and store reachability
    GET    /readyz                                    readiness: 200 or 503 (proxy.control.ready)
    GET    /metrics                                   Prometheus text format
    POST   /v1/claims                                 create; the proxy token is in this answer only
    GET    /v1/claims                                 list
    GET    /v1/claims/{claim}                         read
    DELETE /v1/claims/{claim}                         revoke everything it holds, close its tunnels
    POST   /v1/claims/{claim}/token                   rotate the proxy token (shown once)
    GET    /v1/claims/{claim}/credentials             list
    PUT    /v1/claims/{claim}/credentials/{name}      create (201) or replace (200)
    PATCH  /v1/claims/{claim}/credentials/{name}      partial update
    GET    /v1/claims/{claim}/credentials/{name}      read (never the value, not even a hash)
    DELETE /v1/claims/{claim}/credentials/{name}      delete

Credential answers carry ``ETag: "<version>"``; writes accept ``If-Match: "<version>"`` (or
``*``: must exist) for compare-and-set, and a stale one gets 412 with nothing changed (RFC 9110
§13.1.1). Every error is ``{"error": code, "message": sentence, "field": name|null}`` with a 4xx
status; a request body over ``MAX_BODY`` bytes gets 413. Validation messages never echo input.

Listeners: a Unix socket (mode 0600, in the 0700 state dir) needs no token: only its owner can
connect. Loopback TCP requires ``Authorization: Bearer <operator token>``, and a ``Host`` (and
``Origin``, when sent) naming the listener itself (403 ``foreign_host``: DNS rebinding). A claim id
or credential name holding ``/`` (plain or ``%2F``) gets 422 naming the field
(:mod:`proxy.control.apiedge`).
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.control.apiedge import (
    allowed_authorities,
    encoded_slash_field,
    foreign_authority,
    plain_slash_field,
)
from proxy.control.ready import NotReadyOut, Readiness, ReadyOut
from proxy.control.service import Control, ControlError, Coverage
from proxy.core import slots
from proxy.core.policy import DEFAULT_SURFACES, SURFACES, Misplaced
from proxy.store.sqlite import ClaimRecord, CredentialRecord

log = logging.getLogger("surrogate")

MAX_BODY = 64 * 1024
# Probes answer without the operator token (an orchestrator's probe holds none); neither says
# anything but whether the node is up and ready, and the store's version.
_PROBES = frozenset({"/healthz", "/readyz"})
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ClaimId = Annotated[str, PathParam(pattern=ID_PATTERN, description="claim id")]
CredName = Annotated[str, PathParam(pattern=ID_PATTERN, description="credential name")]
IfMatch = Annotated[str | None, Header(pattern=r'^\s*("[0-9]+"|\*)\s*$', description='"<version>" or *')]


PLACEHOLDER_PATTERN = r"^surr_[A-Za-z0-9]{16,64}$"
Host = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^\s/:@]+$")]
Value = Annotated[str, Field(min_length=1, max_length=16384, pattern=r"^[^\x00-\x1f\x7f]+$")]
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
    value: Value = Field(description="the secret; write-only")
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
    value: Value | None = None
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


class CredentialWritten(CredentialOut):
    coverage: list[CoverageOut]


class ErrorOut(BaseModel):
    error: str
    message: str
    field: str | None = None


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _claim_out(r: ClaimRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "pool": r.pool,
        "sources": list(r.sources),
        "interface": r.interface,
        "version": r.version,
        "created_at": _ts(r.created_at),
        "updated_at": _ts(r.updated_at),
    }


def _cred_out(r: CredentialRecord, cov: list[Coverage] | None = None) -> dict[str, Any]:
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
    }
    if cov is not None:
        out["coverage"] = [{"host": c.host, "rule": c.rule, "header": c.header} for c in cov]
    return out


def _etag(version: int) -> dict[str, str]:
    return {"ETag": f'"{version}"'}


def _if_match(value: str | None) -> tuple[int | None, bool]:
    """(version to compare, must-exist). Raises ControlError(400) for a malformed header."""
    if value is None:
        return None, False
    value = value.strip()
    if value == "*":
        return None, True
    if len(value) >= 3 and value[0] == value[-1] == '"' and value[1:-1].isdigit():
        return int(value[1:-1]), False
    raise ControlError(
        400, "invalid_if_match", 'If-Match must be a quoted version like "3", or *', "If-Match"
    )


# The schema's patterns, said as sentences (pydantic would quote the regex).
_PATTERN_ERRORS = {
    "id": (
        422,
        "invalid_id",
        "id must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
    "claim": (422, "invalid_id", "claim id must be 1-63 letters, digits, '.', '_' or '-'"),
    "name": (422, "invalid_name", "credential name must be 1-63 letters, digits, '.', '_' or '-'"),
    "value": (
        422,
        "invalid_value",
        "value must be 1-16384 characters with no control characters (CR, LF, NUL...)",
    ),
    "placeholder": (422, "invalid_placeholder", "placeholder must be 'surr_' + 16..64 letters or digits"),
    "set_header": (422, "invalid_inject", "inject.set_header must be an HTTP header name"),
    "format": (422, "invalid_inject", "inject.format must contain '{value}' and no control characters"),
    "if-match": (400, "invalid_if_match", 'If-Match must be a quoted version like "3", or *'),
}


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, "field": field}, status_code=status)


def _slash_error(field: str) -> JSONResponse:
    what = {"claim": "a claim id", "name": "a credential name"}.get(field, "a path segment")
    return _error(
        422,
        "invalid_id" if field == "claim" else "invalid_name" if field == "name" else "invalid_path",
        f"{what} cannot contain '/' (plain or %2F): ids are 1-63 letters, digits, '.', '_' or '-'",
        field,
    )


class _BodyLimit:
    """Refuse request bodies over MAX_BODY bytes (413) before they are parsed: a declared length
    over it at once, a chunked one (no Content-Length) once its reads pass it. The body (at most
    MAX_BODY) is read here whole and replayed to the app, so the 413 is this middleware's own
    answer, never a parse error of the app (issue 20)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, "body_too_large", f"request body over {MAX_BODY} bytes")
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > MAX_BODY:
            await too_large(scope, receive, send)
            return
        held: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the app sees it as it would have
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return held.pop(0) if held else await receive()

        await self.app(scope, replay, send)


def make_app(
    control: Control,
    operator_token: str | None = None,
    listen: tuple[str, int] | None = None,
    readiness: Readiness | None = None,
    names: Sequence[str] = (),
) -> FastAPI:
    """The API for one listener. ``operator_token``: required as a Bearer token (TCP listener);
    None: no token (the 0600 Unix socket). ``listen``: the TCP listener's address, required with
    a token: ``Host`` (and ``Origin`` when sent) must name it or one of ``names``, else 403
    (:mod:`proxy.control.apiedge`).
    ``/metrics`` serves ``control.metrics``; ``/readyz`` answers ``readiness`` (default: ready while
    the store answers, for this host's name). Raises ValueError for a token without ``listen``."""
    if operator_token is not None and listen is None:
        raise ValueError("a TCP control listener needs its own address for the Host check")
    authorities = allowed_authorities(*listen, names) if listen is not None else None
    ready = readiness or Readiness(control.store, socket.gethostname())
    app = FastAPI(title="surrogate control API", version="1", docs_url=None, redoc_url=None)
    calls = control.metrics.control_requests
    who = "token:operator" if operator_token else "socket"
    errors: dict[int | str, dict[str, Any]] = {
        s: {"model": ErrorOut} for s in (400, 401, 403, 404, 409, 412, 413, 422)
    }

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if authorities is not None:
            bad = foreign_authority(request.headers.get("host"), request.headers.get("origin"), authorities)
            if bad is not None:
                calls.labels(request.method, "4xx").inc()
                return _error(
                    403,
                    "foreign_host",
                    f"{bad} does not name this listener; send Host: {min(authorities)} "
                    "(a browser page under another name cannot reach the control API)",
                    bad,
                )
        if operator_token is not None and request.url.path not in _PROBES:
            given = request.headers.get("authorization", "")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), operator_token.encode()
            ):
                response: Response = _error(
                    401, "unauthorized", "send Authorization: Bearer <operator token>"
                )
                calls.labels(request.method, "4xx").inc()
                return response
        slashed = encoded_slash_field(request.scope.get("raw_path") or request.url.path.encode())
        if slashed is not None:  # before routing: the server decoded it into another path
            calls.labels(request.method, "4xx").inc()
            return _slash_error(slashed)
        try:
            response = await call_next(request)
        except ControlError as e:
            response = _error(e.status, e.code, e.message, e.field)
        except Exception as e:  # a bug: a JSON 500, counted, and only the error's type on stderr
            # (its message may quote a request value, and the traceback would print it)
            log.error("control API %s %s failed with %s", request.method, request.url.path, type(e).__name__)
            why = "the control API failed on this request (see the proxy's stderr)"
            response = _error(500, "internal_error", why)
        calls.labels(request.method, f"{response.status_code // 100}xx").inc()
        return response

    app.add_middleware(_BodyLimit)

    @app.exception_handler(ControlError)
    async def control_error(_: Request, e: ControlError) -> JSONResponse:
        return _error(e.status, e.code, e.message, e.field)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        problems, field = [], None
        for err in e.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "path", "header")]
            field = field or ".".join(loc) or None
            if err.get("type") == "json_invalid":
                return _error(400, "malformed_json", "the request body is not valid JSON")
            known = _PATTERN_ERRORS.get(loc[-1] if loc else "")
            if known and err.get("type") in ("string_pattern_mismatch", "string_too_long"):
                status, code, message = known
                return _error(status, code, message, ".".join(loc))
            if err.get("type") == "extra_forbidden":
                problems.append(f"{'.'.join(loc)}: unknown field")
            else:  # pydantic's sentence, never the input value
                problems.append(f"{'.'.join(loc) or 'body'}: {err.get('msg')}")
        return _error(422, "invalid_request", "; ".join(problems), field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404 and (slashed := plain_slash_field(request.url.path)) is not None:
            return _slash_error(slashed)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        response = _error(e.status_code, code, str(e.detail))
        if e.status_code == 405:  # Allow lists every method of the resource (RFC 9110 §15.5.6)
            methods = {
                m
                for route in app.routes
                if route.matches(request.scope)[0] is not Match.NONE
                for m in getattr(route, "methods", None) or ()
            }
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        control.store.data_version()  # raises if the store cannot be read
        return {"status": "ok"}

    @app.get("/readyz", response_model=ReadyOut, responses={503: {"model": NotReadyOut}})
    async def readyz() -> JSONResponse:
        status, body = ready.check()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", response_class=Response)
    async def metrics_text() -> Response:
        return Response(generate_latest(control.metrics.exposition()), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/claims", status_code=201, response_model=ClaimCreated, responses=errors)
    async def create_claim(body: ClaimIn) -> dict[str, Any]:
        record, token = control.create_claim(who, body.id, body.pool, body.sources, body.interface)
        return {**_claim_out(record), "proxy_token": token}

    @app.get("/v1/claims", response_model=list[ClaimOut])
    async def list_claims() -> list[dict[str, Any]]:
        return [_claim_out(r) for r in control.list_claims()]

    @app.get("/v1/claims/{claim}", response_model=ClaimOut, responses=errors)
    async def get_claim(claim: ClaimId) -> dict[str, Any]:
        return _claim_out(control.get_claim(claim))

    @app.delete("/v1/claims/{claim}", status_code=204, responses=errors)
    async def delete_claim(claim: ClaimId) -> Response:
        control.delete_claim(who, claim)
        return Response(status_code=204)

    @app.post("/v1/claims/{claim}/token", response_model=ClaimCreated, responses=errors)
    async def rotate_token(claim: ClaimId) -> dict[str, Any]:
        record, token = control.rotate_token(who, claim)
        return {**_claim_out(record), "proxy_token": token}

    @app.get("/v1/claims/{claim}/credentials", response_model=list[CredentialOut], responses=errors)
    async def list_credentials(claim: ClaimId) -> list[dict[str, Any]]:
        return [_cred_out(r) for r in control.list_credentials(claim)]

    @app.put("/v1/claims/{claim}/credentials/{name}", response_model=CredentialWritten, responses=errors)
    async def put_credential(
        claim: ClaimId,
        name: CredName,
        body: CredentialPut,
        response: Response,
        if_match: IfMatch = None,
    ) -> dict[str, Any]:
        version, must_exist = _if_match(if_match)
        if must_exist:  # "*": only if it exists (RFC 9110 §13.1.1)
            control.get_claim(claim)
            current = control.store.get_credential(claim, name)
            if current is None:
                raise ControlError(412, "version_mismatch", f"If-Match: * but no credential {name!r} exists")
            version = current.version
        fields = {
            "hosts": body.hosts,
            "value": body.value,
            "placeholder": body.placeholder,
            "inject_header": body.inject.set_header if body.inject else None,
            "inject_format": body.inject.format if body.inject else None,
            "expires_at": body.expires_at.timestamp() if body.expires_at else None,
            "max_requests": body.max_requests,
            "surfaces": body.surfaces,
            "headers": body.headers,
            "basic_parts": body.basic_parts,
            "on_misplaced": body.on_misplaced,
            "oauth": body.oauth,
        }
        record, cov, created = control.put_credential(who, claim, name, fields, version)
        response.status_code = 201 if created else 200
        response.headers.update(_etag(record.version))
        return _cred_out(record, cov)

    @app.patch("/v1/claims/{claim}/credentials/{name}", response_model=CredentialWritten, responses=errors)
    async def patch_credential(
        claim: ClaimId,
        name: CredName,
        body: CredentialPatch,
        response: Response,
        if_match: IfMatch = None,
    ) -> dict[str, Any]:
        version, _ = _if_match(if_match)
        changes: dict[str, Any] = {}
        for key in body.model_fields_set:
            value = getattr(body, key)
            if key == "inject":
                changes["inject_header"] = value.set_header if value else None
                changes["inject_format"] = value.format if value else None
            elif key == "expires_at":
                changes["expires_at"] = value.timestamp() if value else None
            elif key == "max_requests":
                changes["max_requests"] = value
            elif key in ("surfaces", "on_misplaced", "headers", "basic_parts"):  # null: back to the default
                changes[key] = value
            elif value is None:
                raise ControlError(422, "invalid_request", f"{key} cannot be null", key)
            else:
                changes[key] = value
        record, cov = control.patch_credential(who, claim, name, changes, version)
        response.headers.update(_etag(record.version))
        return _cred_out(record, cov)

    @app.get("/v1/claims/{claim}/credentials/{name}", response_model=CredentialOut, responses=errors)
    async def get_credential(claim: ClaimId, name: CredName, response: Response) -> dict[str, Any]:
        record = control.get_credential(claim, name)
        response.headers.update(_etag(record.version))
        return _cred_out(record)

    @app.delete("/v1/claims/{claim}/credentials/{name}", status_code=204, responses=errors)
    async def delete_credential(claim: ClaimId, name: CredName, if_match: IfMatch = None) -> Response:
        version, _ = _if_match(if_match)
        control.delete_credential(who, claim, name, version)
        return Response(status_code=204)

    return app
