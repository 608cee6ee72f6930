"""The approvals page (proxy.control.ui) over a real store and the real app of a TCP listener:
rendering and escaping of hostile fields, sign-in, unauthenticated and cross-site requests
refused, the CSRF token, plain-form approve/deny/revoke (no JavaScript), the security headers."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from proxy.control.api import make_app
from proxy.control.service import Control
from proxy.store.base import ApprovalRecord
from proxy.store.sqlite import Store
from unit.control.world import SECRET, claim

TOKEN = "operator-token-" + "u" * 24
BASE = "http://127.0.0.1:9090"
FORM = {"content-type": "application/x-www-form-urlencoded"}


class Page(HTMLParser):
    """The page's forms (action → fields), scripts and styles, as a browser would see them."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[dict[str, str | None]] = []
        self.styles: list[dict[str, str | None]] = []
        self.tags: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "form":
            self.forms.append((a.get("action") or "", {}))
        elif tag in ("input", "select", "button") and self.forms and a.get("name"):
            self.forms[-1][1].setdefault(a["name"] or "", a.get("value") or "")
        elif (
            tag == "option" and self.forms and "scope" in self.forms[-1][1] and not self.forms[-1][1]["scope"]
        ):
            self.forms[-1][1]["scope"] = a.get("value") or ""
        elif tag == "script":
            self.scripts.append(a)
        elif tag == "style":
            self.styles.append(a)

    def form(self, action: str) -> dict[str, str]:
        return next(dict(f) for act, f in self.forms if act == action)


def ask(store: Store, **kw: Any) -> ApprovalRecord:
    now = time.time()
    fields: dict[str, Any] = {
        "id": secrets.token_urlsafe(16), "claim_id": "c1", "pool": "p", "method": "POST",
        "host": "api.test", "port": 443, "path": "/v1/x", "credentials": ("k",), "preview": "{}",
        "rule": "rules.yaml:3 api.test", "scopes": ("once", "session", "for", "always"),
        "created_at": now, "expires_at": now + 60,
    }  # fmt: skip
    record = ApprovalRecord(**{**fields, **kw})
    store.add_approval(record)
    return record


def app_client(control: Control, tls: bool = False) -> httpx.AsyncClient:
    app = make_app(control, TOKEN, ("127.0.0.1", 9090), tls=tls)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)


@pytest.fixture
async def anon(control: Control) -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(control) as client:
        yield client


@pytest.fixture
async def ui(control: Control) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in by the form (its cookie jar holds the session)."""
    async with app_client(control) as client:
        r = await client.post("/ui/login", content=f"token={TOKEN}", headers=FORM)
        assert r.status_code == 303 and r.headers["location"] == "/ui/approvals", r.text
        yield client


async def page(client: httpx.AsyncClient) -> tuple[str, Page]:
    r = await client.get("/ui/approvals")
    assert r.status_code == 200, r.text
    return r.text, Page(r.text)


HOSTILE = [
    ("path", "/a/<script>alert(1)</script>?q=\"'&x=</pre><img src=x onerror=alert(2)>"),
    ("host", 'evil.test"><script>alert(3)</script>'),
    ("preview", '{"k": "surr_AAAAAAAAAAAAAAAAAAAA"}</pre><script>alert(4)</script><!--'),
    ("claim_id", "<b>c1</b>"),
    ("rule", "<iframe src=//evil.test>"),
    ("credentials", ("<svg onload=alert(5)>",)),
    ("method", "<POST>"),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_every_field_a_sandbox_controls_is_shown_as_text(
    ui: httpx.AsyncClient, store: Store, field: str, value: Any
) -> None:
    a = ask(store, **{field: value})
    html, p = await page(ui)
    text = value[0] if isinstance(value, tuple) else value
    assert text not in html  # never verbatim: every <, >, & and quote is escaped
    assert _escaped(text) in html
    assert p.tags.count("script") == 1 and "img" not in p.tags and "iframe" not in p.tags
    assert "svg" not in p.tags and "b" not in p.tags
    assert f'id="approval-{a.id}"' in html


def _escaped(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&#34;").replace("'", "&#39;"))  # fmt: skip


async def test_the_page_shows_pending_grants_and_decisions_and_no_secret(
    ui: httpx.AsyncClient, control: Control, store: Store
) -> None:
    """A claim holding a canary credential: the page shows its placeholder in the preview and its
    name, never the value."""
    async with app_client(control) as api:
        api.headers["authorization"] = f"Bearer {TOKEN}"
        await claim(api)
        r = await api.put("/v1/claims/c1/credentials/k", json={"value": SECRET, "hosts": ["api.test"]})
        assert r.status_code in (200, 201), r.text
        placeholder = r.json()["placeholder"]
    waiting = ask(store, preview=f'{{"token": "{placeholder}", "secret": "[scrubbed]"}}')
    done = ask(store, path="/v1/done")
    p = Page((await page(ui))[0])
    r = await ui.post(f"/ui/approvals/{done.id}/approve", data={**p.form(f"/ui/approvals/{done.id}/approve"),
                      "scope": "always"})  # fmt: skip
    assert r.status_code == 303 and r.headers["location"] == "/ui/approvals?done=approved"
    html, p = await page(ui)
    assert placeholder in html and SECRET not in html
    pending = html.split('id="pending"')[1].split('id="grants"')[0]
    grants = html.split('id="grants"')[1].split('id="decided"')[0]
    decided = html.split('id="decided"')[1]
    assert waiting.id in pending and done.id not in pending
    assert "/v1/done" in grants and "always" in grants and "/v1/done" in decided and "ui:operator" in decided


async def test_unauthenticated_requests_are_refused_and_change_nothing(
    anon: httpx.AsyncClient, store: Store
) -> None:
    a = ask(store)
    r = await anon.get("/ui/approvals")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login" and a.id not in r.text
    anon.cookies.set("surrogate_ui", "made-up-session", domain="127.0.0.1")
    assert (await anon.get("/ui/approvals")).status_code == 303
    for path in (f"/ui/approvals/{a.id}/approve", f"/ui/approvals/{a.id}/deny", f"/ui/grants/{a.id}/revoke",
                 "/ui/logout"):  # fmt: skip
        r = await anon.post(path, content="csrf=x&scope=once", headers=FORM)
        assert r.status_code == 401, (path, r.status_code)
    assert (await anon.get("/ui/stream")).status_code == 401
    wrong = await anon.post("/ui/login", content="token=" + TOKEN[:-1], headers=FORM)
    assert wrong.status_code == 303 and wrong.headers["location"] == "/ui/login?error=bad_login"
    assert "set-cookie" not in wrong.headers
    assert store.approval(a.id) == a


async def test_the_json_api_still_needs_the_bearer_token(
    anon: httpx.AsyncClient, ui: httpx.AsyncClient
) -> None:
    """The page's cookie is not a credential for the JSON API (Path=/ui/, and the API checks the
    header only)."""
    assert (await anon.get("/approvals")).status_code == 401
    ui.cookies.set("surrogate_ui", ui.cookies["surrogate_ui"], domain="127.0.0.1", path="/")
    assert (await ui.get("/approvals")).status_code == 401


def _bad_posts(csrf: str) -> list[tuple[str, str, dict[str, str], int]]:
    return [
        ("no csrf field", "scope=once", FORM, 403),
        ("an empty csrf", "csrf=&scope=once", FORM, 403),
        ("a wrong csrf", f"csrf={csrf[:-2]}xx&scope=once", FORM, 403),
        ("cross-site fetch", f"csrf={csrf}&scope=once", {**FORM, "sec-fetch-site": "cross-site"}, 403),
        ("same-site fetch", f"csrf={csrf}&scope=once", {**FORM, "sec-fetch-site": "same-site"}, 403),
        ("a foreign Origin", f"csrf={csrf}&scope=once", {**FORM, "origin": "http://evil.test:9090"}, 403),
        ("a null Origin", f"csrf={csrf}&scope=once", {**FORM, "origin": "null"}, 403),
        ("a foreign Host", f"csrf={csrf}&scope=once", {**FORM, "host": "evil.test:9090"}, 403),
        ("a text/plain body", f"csrf={csrf}&scope=once", {"content-type": "text/plain"}, 415),
        ("a JSON body", f'{{"csrf": "{csrf}"}}', {"content-type": "application/json"}, 415),
    ]


async def test_a_post_without_the_sessions_csrf_token_or_from_another_site_is_refused(
    ui: httpx.AsyncClient, store: Store
) -> None:
    a = ask(store)
    csrf = Page((await page(ui))[0]).form(f"/ui/approvals/{a.id}/approve")["csrf"]
    assert len(csrf) >= 32
    for path in (f"/ui/approvals/{a.id}/approve", f"/ui/approvals/{a.id}/deny"):
        for why, body, headers, status in _bad_posts(csrf):
            r = await ui.post(path, content=body, headers=headers)
            assert r.status_code == status, (path, why, r.status_code, r.text)
    assert store.approval(a.id) == a
    # another session's token is not this one's
    async with app_client_like(ui) as other:
        await other.post("/ui/login", content=f"token={TOKEN}", headers=FORM)
        r = await other.post(f"/ui/approvals/{a.id}/deny", content=f"csrf={csrf}", headers=FORM)
        assert r.status_code == 403
    assert store.approval(a.id) == a


def app_client_like(client: httpx.AsyncClient) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=client._transport, base_url=BASE)  # noqa: SLF001 - the same app


async def test_plain_forms_approve_for_a_duration_deny_and_revoke_without_javascript(
    ui: httpx.AsyncClient, store: Store
) -> None:
    a, b = ask(store), ask(store, path="/v1/y")
    p = Page((await page(ui))[0])
    fields = {**p.form(f"/ui/approvals/{a.id}/approve"), "scope": "for", "duration": "10m"}
    with capture_logs() as logs:
        r = await ui.post(
            f"/ui/approvals/{a.id}/approve", data=fields, headers={"sec-fetch-site": "same-origin"}
        )
    assert r.status_code == 303 and r.headers["location"] == "/ui/approvals?done=approved"
    assert (got := store.approval(a.id)) is not None and got.state == "approved" and got.scope == "for:600"
    assert [e["who"] for e in logs if e["event"] == "approval_decided"] == ["ui:operator"]
    r = await ui.post(f"/ui/approvals/{b.id}/deny", data=p.form(f"/ui/approvals/{b.id}/deny"))
    assert r.status_code == 303 and (got := store.approval(b.id)) is not None and got.state == "denied"
    again = await ui.post(f"/ui/approvals/{b.id}/approve", data=p.form(f"/ui/approvals/{b.id}/approve"))
    assert again.headers["location"] == "/ui/approvals?error=not_pending"
    assert "already decided" in (await ui.get(again.headers["location"])).text
    [grant] = store.grants(time.time())
    assert grant.expires_at is not None and 590 < grant.expires_at - time.time() <= 600
    p = Page((await page(ui))[0])
    r = await ui.post(f"/ui/grants/{grant.id}/revoke", data=p.form(f"/ui/grants/{grant.id}/revoke"))
    assert r.headers["location"] == "/ui/approvals?done=revoked" and store.grants(time.time()) == []


@pytest.mark.parametrize("scope", ["for", "forever", "session", "once&scope=always"])
async def test_a_scope_not_offered_or_malformed_is_refused_on_the_page(
    ui: httpx.AsyncClient, store: Store, scope: str
) -> None:
    a = ask(store, scopes=("once", "for"))
    csrf = Page((await page(ui))[0]).form(f"/ui/approvals/{a.id}/approve")["csrf"]
    duration = "" if scope == "for" else "10m"
    body = f"csrf={csrf}&scope={scope}&duration={duration}"
    r = await ui.post(f"/ui/approvals/{a.id}/approve", content=body, headers=FORM)
    if scope == "once&scope=always":  # the first value counts: once
        assert r.headers["location"].endswith("done=approved")
        assert (got := store.approval(a.id)) is not None and got.scope == "once"
    else:
        assert r.headers["location"] == "/ui/approvals?error=bad_scope", (scope, r.headers)
        assert store.approval(a.id) == a


async def test_a_script_with_the_bearer_token_needs_no_session_or_csrf(
    anon: httpx.AsyncClient, store: Store
) -> None:
    a = ask(store)
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert a.id in (await anon.get("/ui/approvals", headers=auth)).text
    r = await anon.post(f"/ui/approvals/{a.id}/deny", content="", headers={**FORM, **auth})
    assert r.status_code == 303 and (got := store.approval(a.id)) is not None and got.state == "denied"


@pytest.mark.parametrize("tls", [False, True])
async def test_the_session_cookie_is_httponly_strict_and_secure_on_tls(control: Control, tls: bool) -> None:
    async with app_client(control, tls) as client:
        r = await client.post("/ui/login", content=f"token={TOKEN}", headers=FORM)
    cookie = r.headers["set-cookie"]
    assert re.match(r"surrogate_ui=[A-Za-z0-9_-]{40,};", cookie) and TOKEN not in cookie
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui/"} <= attrs
    assert ("secure" in attrs) is tls


async def test_every_answer_forbids_framing_caching_and_foreign_script(ui: httpx.AsyncClient) -> None:
    for path in ("/ui/approvals", "/ui/login", "/ui/"):
        r = await ui.get(path)
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
        assert r.headers["referrer-policy"] == "same-origin"
    r = await ui.get("/ui/approvals")
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", r.headers["content-security-policy"])
    assert nonce is not None
    p = Page(r.text)
    assert [s.get("nonce") for s in p.scripts] == [nonce[1]] and len(p.styles) == 1
    assert nonce[1] != re.search(r"nonce-([A-Za-z0-9_-]+)", (await ui.get("/ui/approvals")).headers[
        "content-security-policy"])[1]  # fmt: skip


@pytest.mark.parametrize("path", ["/ui/login", "/ui/approvals", "/ui/login?error=bad_login"])
async def test_the_referrer_policy_lets_a_browser_send_the_pages_own_origin(
    ui: httpx.AsyncClient, path: str
) -> None:
    """Under ``no-referrer`` (header or meta) a browser sends ``Origin: null`` on the page's form
    POSTs (WHATWG Fetch §3.2.5), which the listener refuses: no button worked in Chromium. Every
    policy a page states must be one under which a same-origin POST carries the real origin."""
    sends_origin = {"same-origin", "origin", "strict-origin", "origin-when-cross-origin",
                    "strict-origin-when-cross-origin"}  # fmt: skip
    r = await ui.get(path)
    assert r.headers["referrer-policy"] in sends_origin
    metas = re.findall(r'<meta name="referrer" content="([^"]*)"', r.text)
    assert metas and all(m in sends_origin for m in metas)
    # and the one a browser then sends is served, where null stays refused (_bad_posts)
    p = Page(r.text)
    if path == "/ui/approvals":
        form = p.form("/ui/logout")
        r = await ui.post("/ui/logout", data=form, headers={"origin": BASE, "sec-fetch-site": "same-origin"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?done=signed_out"


@pytest.mark.parametrize("path", ["/ui/login", "/ui/approvals"])
async def test_the_style_is_admitted_by_its_hash_not_the_responses_nonce(
    ui: httpx.AsyncClient, path: str
) -> None:
    """The script parses each re-fetched page, whose style a nonce would tie to that response:
    Chromium then reported a CSP violation on every re-render. The policy names the hash of the
    style's exact text (CSP3 hash-source), the same in every response, and no inline style else."""
    first, second = await ui.get(path), await ui.get(path)
    for r in (first, second):
        csp = r.headers["content-security-policy"]
        [style_src] = [d.strip() for d in csp.split(";") if d.strip().startswith("style-src ")]
        [text] = re.findall(r"<style>(.*?)</style>", r.text, re.S)
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert style_src == f"style-src 'sha256-{digest}'"
        assert " style=" not in r.text and "unsafe" not in csp
    assert first.headers["content-security-policy"] != second.headers["content-security-policy"]  # the nonce


async def test_sign_out_ends_the_session(ui: httpx.AsyncClient) -> None:
    p = Page((await page(ui))[0])
    r = await ui.post("/ui/logout", data=p.form("/ui/logout"))
    assert r.status_code == 303 and "max-age=0" in r.headers["set-cookie"].lower()
    ui.cookies.clear()
    assert (await ui.get("/ui/approvals")).status_code == 303


async def test_the_unix_socket_listener_serves_no_page(control: Control) -> None:
    transport = httpx.ASGITransport(app=make_app(control))
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as client:
        assert (await client.get("/ui/approvals")).status_code == 404


async def test_the_page_lists_no_withdrawn_request(ui: httpx.AsyncClient, store: Store) -> None:
    """A client gone is no decision; the page read every approval ever asked to show 20, and a
    sandbox asking and going away at its rate limit leaves thousands an hour (review r-approve)."""
    for i in range(30):
        store.withdraw_approval(ask(store, path=f"/v1/gone{i}").id, "client gone")
    timed_out = ask(store, path="/v1/late")
    store.withdraw_approval(timed_out.id, "timeout", "timed_out")
    html, _ = await page(ui)
    decided = html.split('id="decided"')[1]
    assert "/v1/gone" not in decided and "/v1/late" in decided
