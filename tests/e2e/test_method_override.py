"""A rule's ``methods`` and the methods a server acts on (attack session 2026-12-04): a ``GET``
carrying ``X-HTTP-Method-Override: POST`` is a POST to Google APIs, Rack and many more, and
passed a POST-only ask rule unasked; a GET-only egress rule let a GET overridden to DELETE
through. Every reading counts now (proxy/core/methods.py): an egress rule must list them all
(``method_not_allowed``); an ask rule (proxy/core/approvals.py) asks for any of them: the
override headers, a ``_method`` query parameter, and a POST's body naming ``_method`` (a form,
multipart, JSON, percent-encoded) under a rule that leaves POST out; a POST body that cannot be
read first asks too. Such a request is approved ``once`` only, and a standing grant for its
request-line method does not cover it. A POST whose body names no method still passes
unasked, its body swapped and delivered whole. (Hook routes: tests/e2e/test_hooks.py.)"""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_ApproveMethodsPlaceholder1"


def _rules(port: int) -> str:
    return rules(
        [
            egress("api.test", port, paths=["/send"], approve={"methods": ["POST"], "timeout": 20}),
            egress("api.test", port, paths=["/del"], approve={"methods": ["DELETE"], "timeout": 20}),
            egress("api.test", port, paths=["/any"], approve={"timeout": 20}),
            egress("ro.test", port, methods=["GET", "HEAD"]),
        ],
        claims=[claim("c1", [credential("api", PH, ["api.test"], surfaces=["header", "body"])])],
    )


@dataclass
class World:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str

    def curl(self, path: str, *args: str, host: str = "api.test") -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["curl", "-sS", "--max-time", "30", "-x", self.proxy.url("c1", self.token),
             "--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", *args,
             f"https://{host}:{self.upstream.port}{path}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def done(self, proc: subprocess.Popen[bytes]) -> int:
        out, err = proc.communicate(timeout=40)
        self.stage.received.append(out + err)
        return int(out.rpartition(b"\n")[2] or 0)

    def pending(self, timeout: float = 8) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with control(self.proxy) as api:
            while time.monotonic() < deadline:
                got = api.get("/approvals", params={"state": "pending"}).json()
                if got:
                    [one] = got
                    return dict(one)
                time.sleep(0.05)
        return None

    def decide(self, approval_id: str, verdict: str, scope: str | None = None) -> None:
        with control(self.proxy) as api:
            got = api.post(f"/approvals/{approval_id}/{verdict}", json={"scope": scope} if scope else {})
        assert got.status_code == 200, got.text

    def seen(self, path: str) -> list[Any]:
        return [r for r in list(self.upstream.requests) if r.path == path]

    def asked_once_only(self, proc: subprocess.Popen[bytes], path: str) -> None:
        """The request is held (nothing upstream), offers ``once`` only, and is refused when denied."""
        asked = self.pending()
        if asked is None:
            code = self.done(proc)
            raise AssertionError(f"{path} was not held: answered {code}, upstream saw {len(self.seen(path))}")
        assert asked["scopes"] == ["once"], asked
        assert self.seen(path) == []
        self.decide(asked["id"], "deny")
        assert self.done(proc) == 403
        assert self.seen(path) == []


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("methods")) as st:
        token, secret = st.token(), st.secret("api")
        up = st.upstream(["api.test", "ro.test"])
        proxy = st.proxy(_rules(up.port), resolve=["api.test", "ro.test"], control=True)
        yield World(st, up, proxy, token, secret)


OVERRIDES = {
    "x-http-method-override": ("/send/a", ["-H", "X-HTTP-Method-Override: POST"]),
    "x-http-method": ("/send/b", ["-H", "X-HTTP-Method: post"]),
    "x-method-override-list": ("/send/c", ["-H", "X-Method-Override: PATCH, POST"]),
    "query": ("/send/d?_method=POST", []),
    "query-escaped": ("/send/e?%5Fmethod=post", []),
}


@pytest.mark.parametrize("shape", list(OVERRIDES))
def test_a_get_naming_an_asked_method_elsewhere_is_held(world: World, shape: str) -> None:
    path, args = OVERRIDES[shape]
    world.asked_once_only(world.curl(path, *args, "-H", f"Authorization: Bearer {PH}"), path)


BODIES = {
    "form": ("/del/a", ["--data-binary", "_method=DELETE&id=1"]),
    "form-escaped": ("/del/b", ["--data-binary", "id=1&%5Fmethod=delete"]),
    "json": ("/del/c", ["-H", "Content-Type: application/json", "--data-binary", '{"_method": "DELETE"}']),
    "json-escaped": ("/del/d", ["--data-binary", '{"\\u005fmethod": "DELETE"}']),
    "multipart": ("/del/e", ["-F", "_method=DELETE", "-F", "id=1"]),
    "php-dot-form": ("/del/h", ["--data-binary", "id=1&.method=DELETE"]),
    "php-bracket-form": ("/del/i", ["--data-binary", "[method=DELETE"]),
    "multipart-rfc2231": (
        "/del/j",
        [
            "-H",
            "Content-Type: multipart/form-data; boundary=b",
            "--data-binary",
            "--b\r\nContent-Disposition: form-data; name*=UTF-8''_%6Dethod\r\n\r\nDELETE\r\n--b--\r\n",
        ],
    ),
    "multipart-quoted-escape": (
        "/del/k",
        [
            "-H",
            "Content-Type: multipart/form-data; boundary=b",
            "--data-binary",
            '--b\r\nContent-Disposition: form-data; name="_\\method"\r\n\r\nDELETE\r\n--b--\r\n',
        ],
    ),
    "json-bom-escaped": ("/del/l", ["--data-binary", '\ufeff{"_\\u006dethod": "DELETE"}']),
    "semicolon-form": ("/del/m", ["--data-binary", "id=1;_me%74hod=DELETE"]),
    "unread-chunked": ("/del/f", ["-H", "Transfer-Encoding: chunked", "--data-binary", "id=1"]),
    "unread-encoded": ("/del/g", ["-H", "Content-Encoding: gzip", "--data-binary", "not really gzip"]),
}


@pytest.mark.parametrize("shape", list(BODIES))
def test_a_post_whose_body_may_name_an_asked_method_is_held(world: World, shape: str) -> None:
    path, args = BODIES[shape]
    world.asked_once_only(world.curl(path, *args), path)


def test_a_post_whose_body_names_no_method_passes_unasked_and_whole(world: World) -> None:
    body = f'{{"payment_method": "card", "key": "{PH}"}}'
    code = world.done(world.curl("/del/plain", "-H", "Content-Type: application/json", "--data-binary", body))
    assert code == 200
    [got] = world.seen("/del/plain")
    swapped = body.replace(PH, world.secret).encode()
    assert got.method == "POST" and got.digest == hashlib.sha256(swapped).hexdigest()
    assert world.pending(timeout=0.2) is None


def test_a_grant_for_a_get_does_not_cover_a_get_overridden_to_delete(world: World) -> None:
    proc = world.curl("/any/g")
    asked = world.pending()
    assert asked is not None and "always" in asked["scopes"], asked
    world.decide(asked["id"], "approve", "always")
    assert world.done(proc) == 200
    assert world.done(world.curl("/any/g")) == 200  # the grant covers the plain GET
    assert world.pending(timeout=0.2) is None
    world.asked_once_only(world.curl("/any/g/x", "-H", "X-HTTP-Method-Override: DELETE"), "/any/g/x")


GET_ONLY = {
    "override": ["-H", "X-HTTP-Method-Override: DELETE"],
    "odata": ["-H", "X-HTTP-Method: delete"],
    "list": ["-H", "X-Method-Override: GET, PUT"],
    "query": ["-G", "--data-urlencode", "_method=DELETE"],
    "underscore-header": ["-H", "X_HTTP_Method_Override: DELETE"],
    "php-dot-query": ["-G", "--data-raw", ".method=DELETE"],
    "php-bracket-query": ["-G", "--data-raw", "%5Bmethod=DELETE"],
    "array-query": ["-G", "--data-raw", "_method[]=DELETE"],
    "semicolon-query": ["-G", "--data-raw", "x=1;_method=DELETE"],
}


@pytest.mark.parametrize("shape", list(GET_ONLY))
def test_a_get_only_rule_refuses_a_get_a_server_reads_as_another_method(world: World, shape: str) -> None:
    path = f"/ro/{shape}"
    out, _ = world.curl(path, *GET_ONLY[shape], host="ro.test").communicate(timeout=40)
    world.stage.received.append(out)
    assert int(out.rpartition(b"\n")[2] or 0) == 403, out
    assert [r for r in list(world.upstream.requests) if r.path.startswith(path)] == []
    deadline, found = time.monotonic() + 5, []
    while not found and time.monotonic() < deadline:  # written at the flow's end
        events = world.proxy.audit_events()
        found = [e for e in events if e["event"] == "request" and e["path"].split("?")[0] == path]
        time.sleep(0.05)
    [event] = found
    assert event["reason"] == "method_not_allowed" and "also read as" in event["message"], event


def test_a_get_only_rule_still_passes_a_plain_get_and_an_override_naming_get(world: World) -> None:
    assert world.done(world.curl("/ro/plain", host="ro.test")) == 200
    assert world.done(world.curl("/ro/same", "-H", "X-HTTP-Method-Override: get", host="ro.test")) == 200
