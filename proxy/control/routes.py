"""The control API's routes (the table in :mod:`proxy.control.api`), each one call into
:class:`proxy.control.service.Control`: parse the parameters, call, shape the answer.

Credential answers carry ``ETag: "<version>"``; ``If-Match: "<version>"`` (or ``*``: must
exist) makes a write compare-and-set, 412 when stale (RFC 9110 §13.1.1).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.control.approvalroutes import add_approval_routes
from proxy.control.checks import ControlError
from proxy.control.models import (
    ClaimCreated,
    ClaimId,
    ClaimIn,
    ClaimOut,
    CredentialOut,
    CredentialPatch,
    CredentialPut,
    CredentialWritten,
    CredName,
    ErrorOut,
    IfMatch,
    claim_out,
    credential_out,
)
from proxy.control.ready import NotReadyOut, Readiness, ReadyOut
from proxy.control.service import Control


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


def add_routes(app: FastAPI, control: Control, who: str, ready: Readiness) -> None:
    """Add the routes over ``control`` to ``app`` (on the app itself, not an included router: its
    405 handler lists the methods of ``app.routes``). ``who`` names the caller in control audit
    events (``socket`` or ``token:operator``); ``/readyz`` answers ``ready``."""
    errors: dict[int | str, dict[str, Any]] = {
        s: {"model": ErrorOut} for s in (400, 401, 403, 404, 409, 412, 413, 422)
    }

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
        return {**claim_out(record), "proxy_token": token}

    @app.get("/v1/claims", response_model=list[ClaimOut])
    async def list_claims() -> list[dict[str, Any]]:
        return [claim_out(r) for r in control.list_claims()]

    @app.get("/v1/claims/{claim}", response_model=ClaimOut, responses=errors)
    async def get_claim(claim: ClaimId) -> dict[str, Any]:
        return claim_out(control.get_claim(claim))

    @app.delete("/v1/claims/{claim}", status_code=204, responses=errors)
    async def delete_claim(claim: ClaimId) -> Response:
        control.delete_claim(who, claim)
        return Response(status_code=204)

    @app.post("/v1/claims/{claim}/token", response_model=ClaimCreated, responses=errors)
    async def rotate_token(claim: ClaimId) -> dict[str, Any]:
        record, token = control.rotate_token(who, claim)
        return {**claim_out(record), "proxy_token": token}

    @app.get("/v1/claims/{claim}/credentials", response_model=list[CredentialOut], responses=errors)
    async def list_credentials(claim: ClaimId) -> list[dict[str, Any]]:
        return [credential_out(r) for r in control.list_credentials(claim)]

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
            "kind": body.kind,
            "aws_sigv4": body.aws_sigv4.model_dump() if body.aws_sigv4 else None,
            "mint": body.mint.model_dump() if body.mint else None,
            "sign": body.sign.model_dump() if body.sign else None,
        }
        record, cov, created = control.put_credential(who, claim, name, fields, version)
        response.status_code = 201 if created else 200
        response.headers.update(_etag(record.version))
        return credential_out(record, cov)

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
        return credential_out(record, cov)

    @app.get("/v1/claims/{claim}/credentials/{name}", response_model=CredentialOut, responses=errors)
    async def get_credential(claim: ClaimId, name: CredName, response: Response) -> dict[str, Any]:
        record = control.get_credential(claim, name)
        response.headers.update(_etag(record.version))
        return credential_out(record)

    @app.delete("/v1/claims/{claim}/credentials/{name}", status_code=204, responses=errors)
    async def delete_credential(claim: ClaimId, name: CredName, if_match: IfMatch = None) -> Response:
        version, _ = _if_match(if_match)
        control.delete_credential(who, claim, name, version)
        return Response(status_code=204)

    add_approval_routes(app, control, who)  # issue 16: /approvals, /grants
