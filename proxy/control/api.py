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

This module assembles the app for one listener (the guard, the body limit, the error shapes);
the routes are in :mod:`proxy.control.routes`, the bodies in :mod:`proxy.control.models`.
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.control import routes, ui
from proxy.control.apiedge import (
    allowed_authorities,
    encoded_slash_field,
    foreign_authority,
    plain_slash_field,
)
from proxy.control.checks import ControlError
from proxy.control.ready import Readiness
from proxy.control.service import Control
from proxy.core import placeholders

log = logging.getLogger("surrogate")

MAX_BODY = 64 * 1024
# Probes answer without the operator token (an orchestrator's probe holds none); neither says
# anything but whether the node is up and ready, and the store's version.
_PROBES = frozenset({"/healthz", "/readyz"})


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
    "placeholder": (
        422, "invalid_placeholder",
        f"placeholder must be {placeholders.FORMATS}",
    ),
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
    tls: bool = False,
) -> FastAPI:
    """The API for one listener. ``operator_token``: required as a Bearer token (TCP listener);
    None: no token (the 0600 Unix socket). ``listen``: the TCP listener's address, required with
    a token: ``Host`` (and ``Origin`` when sent) must name it or one of ``names``, else 403
    (:mod:`proxy.control.apiedge`).
    ``/metrics`` serves ``control.metrics``; ``/readyz`` answers ``readiness`` (default: ready while
    the store answers, for this host's name). With a token, the operator's approvals page is
    served under ``/ui/`` (:mod:`proxy.control.ui`, which checks the token or its own session
    cookie itself; ``tls``: the cookie is Secure). Raises ValueError for a token without ``listen``."""
    if operator_token is not None and listen is None:
        raise ValueError("a TCP control listener needs its own address for the Host check")
    authorities = allowed_authorities(*listen, names) if listen is not None else None
    ready = readiness or Readiness(control.store, socket.gethostname())
    app = FastAPI(title="surrogate control API", version="1", docs_url=None, redoc_url=None)
    calls = control.metrics.control_requests
    who = "token:operator" if operator_token else "socket"

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if authorities is not None:
            bad = foreign_authority(
                request.headers.get("host"),
                request.headers.get("origin"),
                authorities,
                "https" if tls else "http",
            )
            if bad is not None:
                calls.labels(request.method, "4xx").inc()
                return _error(
                    403,
                    "foreign_host",
                    f"{bad} does not name this listener; send Host: {min(authorities)} "
                    "(a browser page under another name cannot reach the control API)",
                    bad,
                )
        if operator_token is not None and request.url.path not in _PROBES and not _ui(request.url.path):
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

    routes.add_routes(app, control, who, ready)
    if operator_token is not None:
        ui.add_ui_routes(app, control, operator_token, tls)
    return app


def _ui(path: str) -> bool:
    """The approvals page's paths: they authenticate by the token or a session cookie themselves."""
    return path == "/ui" or path.startswith("/ui/")
