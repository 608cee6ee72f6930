"""The operator's approvals page (issue 16), served by the TCP control listener only (never by the
proxy: the proxy refuses its own listeners in every spelling, tests/adversarial/test_approvals_page.py):

    GET  /ui/                          → 303 /ui/approvals
    GET  /ui/login                     the sign-in form;  POST /ui/login  token=… → cookie, 303
    POST /ui/logout                    csrf=… → 303 /ui/login
    GET  /ui/approvals                 pending requests, active grants, last decisions
    GET  /ui/stream                    server-sent events: ``event: approval`` per new or decided one
    POST /ui/approvals/{id}/approve    csrf=…, scope=once|session|for|always, duration=10m → 303
    POST /ui/approvals/{id}/deny       csrf=… → 303
    POST /ui/grants/{id}/revoke        csrf=… → 303

Every route calls the same service functions as the JSON API (:mod:`proxy.control.approvals`);
decisions made here are audited with ``who="ui:operator"``. Authentication and CSRF are
:mod:`proxy.control.uisession`'s. An unauthenticated GET is sent to the sign-in form (303); an
unauthenticated POST or stream gets 401; a POST with a missing or wrong CSRF token, or a
cross-site ``Sec-Fetch-Site``, gets 403 and changes nothing. Forms are
``application/x-www-form-urlencoded`` (WHATWG URL §5; parsed by :func:`urllib.parse.parse_qs`),
anything else is 415.

Every answer carries a Content-Security-Policy with a fresh nonce for the page's one script and
the hash of its one constant style (:data:`proxy.control.uipage.STYLE_SOURCE`; no other script,
no framing: ``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``), ``Cache-Control: no-store``
and ``Referrer-Policy: same-origin``.

Why ``same-origin`` and not ``no-referrer`` (found by the headless-browser test,
tests/e2e/test_approvals_browser.py): under ``no-referrer`` a browser serialises the Origin of a
form POST as ``null`` (WHATWG Fetch §3.2.5, "serializing a request origin"), and the listener's
Origin check (:mod:`proxy.control.apiedge`) rightly refuses ``null``, so no button of the page
worked in a real browser. ``same-origin`` sends the page's own origin to the page itself and no
``Referer`` to any other origin (W3C Referrer Policy §3.4).
"""

from __future__ import annotations

import secrets
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import FastAPI, Path, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse

from proxy.control import approvals as service
from proxy.control import uipage, uisession
from proxy.control.approvalroutes import _events
from proxy.control.checks import ControlError
from proxy.control.service import Control

WHO = "ui:operator"
RECENT = 20  # the last decisions shown
DECIDED = ("approved", "denied", "timed_out")  # the states "last decisions" shows
MAX_FIELDS = 8
ItemId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{16,64}$")]


def _headers(nonce: str) -> dict[str, str]:
    csp = (
        "default-src 'none'; "
        f"script-src 'nonce-{nonce}'; style-src {uipage.STYLE_SOURCE}; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "Cache-Control": "no-store",
        "Referrer-Policy": "same-origin",  # not no-referrer: see the module docstring
        "X-Content-Type-Options": "nosniff",
    }


def _plain(status: int, text: str) -> Response:
    return Response(text + "\n", status_code=status, media_type="text/plain", headers=_headers("none"))


def _see(url: str, cookie: str | None = None) -> Response:
    r = RedirectResponse(url, status_code=303, headers=_headers("none"))
    if cookie is not None:
        r.headers["Set-Cookie"] = cookie
    return r


async def _form(request: Request) -> dict[str, str] | None:
    """The form's fields (the first value of each); None when it is not urlencoded."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return None
    body = (await request.body()).decode("utf-8", "replace")
    try:
        fields = parse_qs(body, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError:  # too many fields
        return {}
    return {k: v[0] for k, v in fields.items()}


def add_ui_routes(app: FastAPI, control: Control, operator_token: str, tls: bool) -> None:
    """Add the page's routes to ``app``; sign-in checks ``operator_token``; ``tls``: cookies Secure."""
    store = control.store
    sessions = uisession.Sessions(operator_token)

    def session_of(request: Request) -> uisession.Session | None:
        return sessions.get(request.cookies.get(uisession.COOKIE))

    def signed_in(request: Request) -> bool:
        return sessions.bearer_ok(request.headers.get("authorization")) or session_of(request) is not None

    async def checked_post(request: Request) -> dict[str, str] | Response:
        """The form of an authorised, same-site POST; else the refusal to send."""
        form = await _form(request)
        if form is None:
            return _plain(415, "send the form as application/x-www-form-urlencoded")
        if sessions.bearer_ok(request.headers.get("authorization")):
            return form  # a script with the token: no ambient credential, no CSRF
        session = session_of(request)
        if session is None:
            return _plain(401, "sign in at /ui/login first")
        if not uisession.fetch_site_ok(request.headers.get("sec-fetch-site")):
            return _plain(403, "refused: a cross-site form (Sec-Fetch-Site)")
        if not uisession.csrf_ok(session, form.get("csrf")):
            return _plain(403, "refused: the form's CSRF token is missing or wrong; reload the page")
        return form

    @app.get("/ui/", include_in_schema=False)
    async def ui_root() -> Response:
        return _see("/ui/approvals")

    @app.get("/ui/login", include_in_schema=False)
    async def login_form(error: str | None = None, done: str | None = None) -> Response:
        nonce = secrets.token_urlsafe(16)
        html = uipage.render_login(nonce, uipage.notice(error or done))
        return HTMLResponse(html, headers=_headers(nonce))

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await _form(request)
        if form is None:
            return _plain(415, "send the form as application/x-www-form-urlencoded")
        if not uisession.fetch_site_ok(request.headers.get("sec-fetch-site")):
            return _plain(403, "refused: a cross-site form (Sec-Fetch-Site)")
        if not sessions.token_ok(form.get("token", "")):
            return _see("/ui/login?error=bad_login")
        return _see("/ui/approvals", uisession.cookie_header(sessions.start(), tls))

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        form = await checked_post(request)
        if isinstance(form, Response):
            return form
        sessions.end(request.cookies.get(uisession.COOKIE))
        return _see("/ui/login?done=signed_out", uisession.cleared_cookie(tls))

    @app.get("/ui/approvals", include_in_schema=False)
    async def page(request: Request, done: str | None = None, error: str | None = None) -> Response:
        session = session_of(request)
        if session is None and not sessions.bearer_ok(request.headers.get("authorization")):
            return _see("/ui/login")
        pending = service.list_approvals(store, "pending")
        # not every approval ever asked: withdrawn ones (a client gone) are no decision, and a
        # sandbox asking and going away at its rate limit leaves thousands an hour (review r-approve)
        closed = [a for s in DECIDED for a in service.list_approvals(store, s)]
        decided = sorted(closed, key=lambda a: a.decided_at or a.created_at, reverse=True)[:RECENT]
        nonce = secrets.token_urlsafe(16)
        html = uipage.render_page(
            nonce, session.csrf if session else "", pending, service.list_grants(store), decided,
            uipage.notice(error or done),
        )  # fmt: skip
        return HTMLResponse(html, headers=_headers(nonce))

    @app.get("/ui/stream", include_in_schema=False)
    async def stream(request: Request) -> Response:
        if not signed_in(request):
            return _plain(401, "sign in at /ui/login first")
        headers = {**_headers("none"), "Cache-Control": "no-store"}
        return StreamingResponse(_events(control), media_type="text/event-stream", headers=headers)

    async def decided(request: Request, approval_id: str, verdict: str) -> Response:
        form = await checked_post(request)
        if isinstance(form, Response):
            return form
        scope: str | None = None
        if verdict == "approve":
            scope = form.get("scope", "once")
            if scope == "for":
                scope = "for:" + form.get("duration", "").strip()
        try:
            service.decide(store, approval_id, verdict, scope, WHO)
        except ControlError as e:
            return _see(f"/ui/approvals?error={_key(e)}")
        return _see(f"/ui/approvals?done={'approved' if verdict == 'approve' else 'denied'}")

    @app.post("/ui/approvals/{approval_id}/approve", include_in_schema=False)
    async def approve(request: Request, approval_id: ItemId) -> Response:
        return await decided(request, approval_id, "approve")

    @app.post("/ui/approvals/{approval_id}/deny", include_in_schema=False)
    async def deny(request: Request, approval_id: ItemId) -> Response:
        return await decided(request, approval_id, "deny")

    @app.post("/ui/grants/{grant_id}/revoke", include_in_schema=False)
    async def revoke(request: Request, grant_id: ItemId) -> Response:
        form = await checked_post(request)
        if isinstance(form, Response):
            return form
        try:
            service.revoke_grant(store, grant_id, WHO)
        except ControlError as e:
            return _see(f"/ui/approvals?error={_key(e)}")
        return _see("/ui/approvals?done=revoked")


def _key(e: ControlError) -> str:
    """The page's notice for a service error (a fixed key; the store's failure stays a 503)."""
    if e.code == "approval_not_pending":
        return "not_pending"
    if e.code in ("not_found", "bad_scope"):
        return e.code
    raise e
