"""The approvals page in a real headless browser (issue 16, "What must be shown" item 2): Debian's
Chromium (``/usr/bin/chromium``) driven by Playwright, against a real ``surrogate run`` whose ask
rule holds a real curl's POST to a real upstream.

The operator signs in on ``/ui/login`` with the control listener's operator token, sees the held
request appear (the page's script re-renders on each ``/ui/stream`` event), and clicks: approve
once → the client gets its response and the upstream received it exactly once; deny → the client
gets ``403 approval_denied`` and the upstream saw no connection; approve ``for`` 10m → the next
request passes unasked, until the grant's Revoke button is clicked. The same clicks work with
JavaScript turned off (plain forms), and over a TLS control listener (``surrogate control`` on the
same state dir, the cookie then ``Secure``).

Screenshots of the page are saved by the run in each test's tmp dir and in the git-ignored
``build/screenshots/`` (the path is printed; docs/approvals.png is one of them). Every page's HTML
as the browser saw it (``page.content()``), every response's head and body the browser received,
and the audit are scanned for the canaries.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import canary
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from harness import ROOT, ProxyProcess, free_port
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

pytestmark = pytest.mark.e2e
playwright_sync = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; never a `playwright install` download
SHOTS = ROOT / "build" / "screenshots"
PH = "surr_BrowserApprovalPlaceholder01"
OPERATOR = "operator-token-" + "b" * 24


def _rules(port: int) -> str:
    ask = {"methods": ["POST"], "paths": ["/echo"], "timeout": 30}
    return rules(
        [egress("api.test", port, approve=ask)],
        claims=[claim("c1", [credential("api", PH, ["api.test"])])],
    )


def _wait_http(url: str, **kw: Any) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url, **kw).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer"
        time.sleep(0.05)


@dataclass
class World:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str
    ui: str  # the control listener's base URL (plain HTTP on loopback, `surrogate run`'s own)
    stream: list[bytes] = field(default_factory=list)  # every byte of /ui/stream, for the scan
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)  # reaped after each test

    def post(self, path: str) -> subprocess.Popen[bytes]:
        """curl -X POST through the proxy, in the background (it waits while held)."""
        proc = subprocess.Popen(
            [
                "curl", "-sS", "--max-time", "40", "-x", self.proxy.url("c1", self.token),
                "--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", "-X", "POST",
                "-H", f"Authorization: Bearer {PH}", "--data-binary", f'{{"key": "{PH}"}}',
                f"https://api.test:{self.upstream.port}{path}",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def reap(self) -> None:
        """Stop and wait for every curl a test left running (it failed before :meth:`done`), so
        none outlives its test and is reported, when collected, against a later one."""
        while self.procs:
            proc = self.procs.pop()
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)

    def done(self, proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
        out, err = proc.communicate(timeout=60)
        self.stage.received.append(out + err)
        body, _, code = out.rpartition(b"\n")
        return int(code or 0), body

    def seen(self, path: str) -> int:
        return sum(1 for r in list(self.upstream.requests) if r.path == path)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} here (apt chromium; .ci/run installs it)")
    with Stage(tmp_path_factory.mktemp("browser")) as st:
        token, secret = st.token(), st.secret("api")
        st.token(OPERATOR, file="operator", newline=False)
        up = st.upstream(["api.test"])
        port = free_port()
        args = ["--control-tcp", f"127.0.0.1:{port}", "--control-token-file", str(st.tmp / "operator")]
        proxy = st.proxy(_rules(up.port), resolve=["api.test"], control=True, args=args)
        _wait_http(f"http://127.0.0.1:{port}/healthz")
        w = World(st, up, proxy, token, secret, f"http://127.0.0.1:{port}")
        threading.Thread(target=_listen, args=(w,), daemon=True).start()
        yield w
        w.reap()
        st.received.append(b"".join(w.stream))


@pytest.fixture(autouse=True)
def _reaped(world: World) -> Iterator[None]:
    yield
    world.reap()


def _listen(w: World) -> None:
    """Read the page's event stream (as a script with the token would) until the proxy stops."""
    auth = {"authorization": f"Bearer {OPERATOR}"}
    try:
        with httpx.stream("GET", w.ui + "/ui/stream", headers=auth, timeout=None) as r:
            for chunk in r.iter_raw():
                w.stream.append(chunk)
    except httpx.HTTPError:  # the proxy stopped
        pass


@pytest.fixture(scope="module")
def chromium(world: World) -> Iterator[Any]:
    """Chromium under Playwright, whose driver (Node: it fetches the routed requests, see
    :class:`Seen`) trusts the stage's CA and nothing else added."""
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} here (apt chromium; .ci/run installs it)")
    driver = playwright_sync.sync_playwright()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NODE_EXTRA_CA_CERTS", str(world.stage.ca.ca_pem))  # read when the driver starts
        p = driver.__enter__()
    try:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()
    finally:
        driver.__exit__(None, None, None)


@dataclass
class Seen:
    """What one browser context received: each response's head and body. Every request but the
    event stream is routed through :meth:`route` (Playwright fetches it, the test keeps the bytes,
    the browser gets exactly those bytes): reading a body after the fact races a navigation."""

    responses: list[tuple[str, bytes]] = field(default_factory=list)
    pages: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # fetches that failed, shown when a test does

    def route(self, route: Any) -> None:
        # A GET is fetched a second time when the first fails, as a browser retries an idempotent
        # request whose reused keep-alive connection the server had just closed; both are kept.
        tries = 2 if route.request.method == "GET" else 1
        for _ in range(tries):
            try:
                r = route.fetch(max_redirects=0)
                body = r.body()
                break
            except playwright_sync.Error as e:  # or the page went on (a reload, a click) or closed
                self.errors.append(f"{route.request.method} {route.request.url}: {e}")
        else:
            with contextlib.suppress(playwright_sync.Error):  # the browser gets no byte of it
                route.abort()
            return
        head = f"{r.status} {route.request.method} {r.url}\n"
        head += "".join(f"{h['name']}: {h['value']}\n" for h in r.headers_array)
        self.responses.append((head, body))
        route.fulfill(response=r, body=body)

    def statuses(self) -> list[str]:
        return [head.split("\n", 1)[0] for head, _ in self.responses]

    def blobs(self) -> dict[str, bytes]:
        out = {f"response {i}": h.encode() + b"\n" + b for i, (h, b) in enumerate(self.responses)}
        out.update({f"page.content() {i}": html for i, html in enumerate(self.pages)})
        return out


class Operator:
    """One browser context (its own cookie jar) signed in on the approvals page."""

    def __init__(self, browser: Any, base: str, tmp: Path, *, javascript: bool = True, **ctx: Any) -> None:
        self.base, self.tmp, self.seen = base, tmp, Seen()
        self.context = browser.new_context(java_script_enabled=javascript, **ctx)
        self.context.set_default_timeout(30000)  # a loaded 2-core machine
        self.page = self.context.new_page()
        self.context.route(lambda url: not url.endswith("/ui/stream"), self.seen.route)
        self.console: list[str] = []  # what the page's console said (a CSP violation is logged there)
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.javascript = javascript

    def close(self) -> None:
        self.context.close()

    def sign_in(self, token: str = OPERATOR) -> None:
        self.page.goto(self.base + "/ui/")
        assert self.page.url == self.base + "/ui/login"  # /ui/ → /ui/approvals → sign in first
        self.page.get_by_label("Operator token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(self.base + "/ui/approvals")
        self.look()

    def look(self) -> str:
        """The page's HTML as the browser holds it now, kept for the canary scan."""
        html = self.page.content()
        self.seen.pages.append(html.encode())
        return html

    def row(self, path: str) -> Any:
        """The pending request's row for ``path``, once it is on the page (the script re-renders
        on the stream's event; without JavaScript the operator reloads)."""
        row = self.page.locator("#pending tr[data-approval]", has_text=path)
        if self.javascript:
            try:
                row.wait_for()
            except playwright_sync.TimeoutError as e:
                raise AssertionError(f"{path} was never shown: {self.seen.errors}") from e
        else:
            deadline = time.monotonic() + 30
            while not row.count():
                assert time.monotonic() < deadline, f"{path} was never shown"
                time.sleep(0.2)
                self.page.reload()
        self.look()
        return row

    def shot(self, name: str) -> Path:
        """A full-page screenshot in the test's tmp dir, copied into build/screenshots/."""
        path = self.tmp / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        SHOTS.mkdir(parents=True, exist_ok=True)
        kept = SHOTS / path.name
        shutil.copyfile(path, kept)
        print(f"screenshot: {kept}", file=sys.stderr)
        return kept

    def notice(self) -> str:
        return str(self.page.locator("p.notice").inner_text())


@pytest.fixture
def operator(chromium: Any, world: World, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(chromium, world.ui, tmp_path)
    yield op
    _scan(world, op)
    op.close()


def _scan(world: World, op: Operator) -> None:
    """The canary scan of what the browser saw; and the page ran as written: no CSP violation,
    no script error in its console (the script's re-render once tripped the style's CSP)."""
    broken = [m for m in op.console if m.startswith(("error:", "pageerror:"))]
    assert not broken, broken
    assert any("/ui/approvals" in s for s in op.seen.statuses()), (op.seen.statuses(), op.seen.errors)
    blobs = {**op.seen.blobs(), "/ui/stream": b"".join(world.stream)}
    world.stage.received.extend(blobs.values())
    canary.assert_absent({**world.stage.artifacts(), **blobs}, world.stage.canaries)


def test_a_wrong_token_is_refused_and_the_right_one_signs_in(operator: Operator) -> None:
    operator.page.goto(operator.base + "/ui/approvals")
    assert operator.page.url == operator.base + "/ui/login"
    operator.page.get_by_label("Operator token").fill("not-the-operator-token")
    operator.page.get_by_role("button", name="Sign in").click()
    operator.page.wait_for_url(operator.base + "/ui/login?error=bad_login")
    assert operator.notice() == "That is not the operator token."
    assert operator.context.cookies() == []
    operator.sign_in()
    [cookie] = operator.context.cookies()
    assert cookie["name"] == "surrogate_ui" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert OPERATOR not in cookie["value"]
    operator.shot("approvals-signed-in")
    operator.page.get_by_role("button", name="Sign out").click()
    operator.page.wait_for_url(operator.base + "/ui/login?done=signed_out")
    assert operator.notice() == "Signed out." and operator.context.cookies() == []
    operator.page.goto(operator.base + "/ui/approvals")
    assert operator.page.url == operator.base + "/ui/login"


def test_a_held_post_appears_and_a_click_approves_it_once(operator: Operator, world: World) -> None:
    operator.sign_in()
    before = world.upstream.connections
    proc = world.post("/echo/clicked")
    row = operator.row("/echo/clicked")
    text = row.inner_text()
    assert f"POST api.test:{world.upstream.port}/echo/clicked" in text
    assert "c1" in text and "api" in text
    preview = row.locator("pre").inner_text()
    assert PH in preview and world.secret not in preview  # the placeholder, never the secret
    assert world.upstream.connections == before and world.seen("/echo/clicked") == 0
    operator.shot("approvals-pending")
    row.get_by_label("scope").select_option("once")
    row.get_by_role("button", name="Approve").click()
    operator.page.wait_for_url(operator.base + "/ui/approvals?done=approved")
    assert operator.notice() == "Approved."
    assert any(s.startswith("303 POST") and s.endswith("/approve") for s in operator.seen.statuses())
    code, body = world.done(proc)
    assert code == 200, body
    assert world.seen("/echo/clicked") == 1
    event = world.proxy.wait_event(event="request", path="/echo/clicked")
    assert event["approval"]["verdict"] == "approve" and event["approval"]["scope"] == "once"
    assert b"/echo/clicked" in b"".join(world.stream)  # the stream told of it (and is scanned)
    decided = operator.page.locator("#decided tr", has_text="/echo/clicked")
    assert "approved (once)" in decided.inner_text() and "ui:operator" in decided.inner_text()
    operator.look()
    operator.shot("approvals-approved")


def test_a_click_on_deny_refuses_it_with_approval_denied(operator: Operator, world: World) -> None:
    operator.sign_in()
    before = world.upstream.connections
    proc = world.post("/echo/denied")
    operator.row("/echo/denied").get_by_role("button", name="Deny").click()
    operator.page.wait_for_url(operator.base + "/ui/approvals?done=denied")
    code, body = world.done(proc)
    assert code == 403 and b"approval_denied" in body, body
    assert world.upstream.connections == before and world.seen("/echo/denied") == 0
    operator.look()
    operator.shot("approvals-denied")


def test_approved_for_10m_the_next_passes_unasked_until_revoked(operator: Operator, world: World) -> None:
    operator.sign_in()
    proc = world.post("/echo/granted")
    row = operator.row("/echo/granted")
    row.get_by_label("scope").select_option("for")
    row.get_by_label("duration (for…)").fill("10m")
    row.get_by_role("button", name="Approve").click()
    operator.page.wait_for_url(operator.base + "/ui/approvals?done=approved")
    assert world.done(proc)[0] == 200
    grant = operator.page.locator("#grants tr[id^=grant-]", has_text="/echo/granted")
    assert "for until" in grant.inner_text()
    with control(world.proxy) as api:
        [stored] = [g for g in api.get("/grants").json() if g["path_prefix"] == "/echo/granted"]
    assert 590 < stored["expires_at"] - time.time() <= 600 and stored["approved_by"] == "ui:operator"
    operator.shot("approvals-grant")
    code, _ = world.done(world.post("/echo/granted"))  # unasked: a held one would wait 30 s
    assert code == 200 and world.seen("/echo/granted") == 2
    grant.get_by_role("button", name="Revoke").click()
    operator.page.wait_for_url(operator.base + "/ui/approvals?done=revoked")
    assert operator.page.locator("#grants tr[id^=grant-]", has_text="/echo/granted").count() == 0
    third = world.post("/echo/granted")  # asked again
    operator.row("/echo/granted").get_by_role("button", name="Deny").click()
    operator.page.wait_for_url(operator.base + "/ui/approvals?done=denied")
    assert world.done(third)[0] == 403 and world.seen("/echo/granted") == 2


def test_without_javascript_the_forms_still_decide(chromium: Any, world: World, tmp_path: Path) -> None:
    op = Operator(chromium, world.ui, tmp_path, javascript=False)
    try:
        op.sign_in()
        proc = world.post("/echo/nojs")
        op.row("/echo/nojs").get_by_role("button", name="Approve").click()
        op.page.wait_for_url(op.base + "/ui/approvals?done=approved")
        code, _ = world.done(proc)
        assert code == 200 and world.seen("/echo/nojs") == 1
        op.look()
    finally:
        _scan(world, op)
        op.close()


@pytest.fixture(scope="module")
def tls_ui(world: World) -> Iterator[tuple[str, str]]:
    """``surrogate control`` on the proxy's state dir, serving the page over TLS on loopback (its
    certificate from the stage's CA, for 127.0.0.1): the base URL and the base64 SHA-256 of the
    certificate's public key (SPKI), which the browser is told to accept."""
    st, port = world.stage, free_port()
    leaf = st.ca.ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(str(st.tmp / "control-cert.pem"))
    leaf.private_key_pem.write_to_path(str(st.tmp / "control-key.pem"))
    err = st.tmp / "control.stderr"
    st.scanned += [err, st.tmp / "control-audit.jsonl"]
    args = [
        sys.executable, "-m", "proxy", "control", "--rules", str(world.proxy.rules),
        "--state-dir", str(world.proxy.state_dir), "--audit-file", str(st.tmp / "control-audit.jsonl"),
        "--control-socket", "none", "--control-tcp", f"127.0.0.1:{port}",
        "--control-token-file", str(st.tmp / "operator"),
        "--control-tls-cert", str(st.tmp / "control-cert.pem"),
        "--control-tls-key", str(st.tmp / "control-key.pem"),
    ]  # fmt: skip
    with open(err, "wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)
    try:
        trusted = ssl.create_default_context(cafile=st.ca.ca_pem)
        _wait_http(f"https://127.0.0.1:{port}/healthz", verify=trusted)
        cert = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())
        spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        yield f"https://127.0.0.1:{port}", base64.b64encode(hashlib.sha256(spki).digest()).decode()
    finally:
        proc.terminate()
        proc.wait(10)


def test_over_tls_the_cookie_is_secure_and_a_click_approves(
    chromium: Any, world: World, tls_ui: tuple[str, str], tmp_path: Path
) -> None:
    """The sidecar's page decides a request the proxy holds (through the shared store); the
    browser sends its https Origin on each POST, which the TLS listener accepts. The browser
    checks the listener's certificate: the routed requests are fetched by Playwright's driver,
    which trusts the stage's CA; the event stream (which the row's appearance needs) goes from
    Chromium itself, which accepts the listener's one key by its SPKI pin, not any certificate."""
    base, spki = tls_ui
    pinned = chromium.browser_type.launch(
        executable_path=str(CHROMIUM), headless=True, args=[f"--ignore-certificate-errors-spki-list={spki}"]
    )
    op = Operator(pinned, base, tmp_path)
    try:
        op.sign_in()
        [cookie] = op.context.cookies()
        assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        proc = world.post("/echo/tls")
        op.row("/echo/tls").get_by_role("button", name="Approve").click()
        op.page.wait_for_url(op.base + "/ui/approvals?done=approved")
        code, _ = world.done(proc)
        assert code == 200 and world.seen("/echo/tls") == 1
        op.look()
        op.shot("approvals-tls")
    finally:
        _scan(world, op)
        op.close()
        pinned.close()
