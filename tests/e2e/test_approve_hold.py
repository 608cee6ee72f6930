"""Ask rules end to end (issue 16): a request an egress rule's ``approve:`` covers is held in a
real proxy until an operator decides through the proxy's own control socket; approved, the
upstream receives it exactly once; denied or timed out, the upstream never saw a connection; a
``for:10m`` approval lets the next one through unasked until its grant is revoked; a reload
between ask and approve that now refuses it refuses the held request. The stage closes with the
canary scan of every audit byte, stderr byte and client-received byte."""

from __future__ import annotations

import json
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
PH = "surr_ApproveHoldPlaceholder0001"


def _rules(port: int, echo_methods: list[str] | None = None) -> str:
    wide: dict[str, Any] = {"approve": {"methods": ["POST"], "paths": ["/echo"], "timeout": 20}}
    if echo_methods is not None:
        wide["methods"] = echo_methods
    return rules(
        [
            egress("api.test", port, paths=["/t"], approve={"timeout": 1.5, "scopes": ["once"]}),
            egress("api.test", port, **wide),
        ],
        claims=[claim("c1", [credential("api", PH, ["api.test"])])],
    )


@dataclass
class Held:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str

    def post(self, path: str, method: str = "POST") -> subprocess.Popen[bytes]:
        """curl -X POST through the proxy, in the background (it waits while held)."""
        return subprocess.Popen(
            [
                "curl", "-sS", "--max-time", "30", "-x", self.proxy.url("c1", self.token),
                "--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", "-X", method,
                "-H", f"Authorization: Bearer {PH}", "--data-binary", f'{{"key": "{PH}"}}',
                f"https://api.test:{self.upstream.port}{path}",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def done(self, proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
        out, err = proc.communicate(timeout=40)
        self.stage.received.append(out + err)
        body, _, code = out.rpartition(b"\n")
        return int(code or 0), body

    def pending(self, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with control(self.proxy) as api:
            while time.monotonic() < deadline:
                got = api.get("/approvals", params={"state": "pending"})
                assert got.status_code == 200, got.text
                if got.json():
                    [one] = got.json()
                    return dict(one)
                time.sleep(0.05)
        raise AssertionError("no pending approval")

    def decide(self, approval_id: str, verdict: str, scope: str | None = None) -> dict[str, Any]:
        with control(self.proxy) as api:
            body = {"scope": scope} if scope else {}
            got = api.post(f"/approvals/{approval_id}/{verdict}", json=body)
        assert got.status_code == 200, got.text
        return dict(got.json())

    def seen(self, path: str) -> int:
        return sum(1 for r in list(self.upstream.requests) if r.path == path)


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Held]:
    with Stage(tmp_path_factory.mktemp("hold")) as st:
        token, secret = st.token(), st.secret("api")
        up = st.upstream(["api.test"])
        proxy = st.proxy(_rules(up.port), resolve=["api.test"], control=True)
        yield Held(st, up, proxy, token, secret)


def test_a_held_post_approved_once_reaches_the_upstream_exactly_once(held: Held) -> None:
    before = held.upstream.connections
    proc = held.post("/echo/once")
    asked = held.pending()
    assert asked["method"] == "POST" and asked["host"] == "api.test" and asked["path"] == "/echo/once"
    assert asked["credentials"] == ["api"] and asked["rule"] == "p.egress[1]"
    assert PH in asked["preview"] and held.secret not in asked["preview"]
    time.sleep(0.5)  # held a while: still nothing upstream
    assert held.upstream.connections == before and held.seen("/echo/once") == 0
    held.decide(asked["id"], "approve", "once")
    code, body = held.done(proc)
    assert code == 200, body
    assert held.seen("/echo/once") == 1
    event = held.proxy.wait_event(event="request", path="/echo/once")
    assert event["approval"] == {"id": asked["id"], "verdict": "approve", "scope": "once"}
    assert event["decision"] == "allow"
    held.proxy.wait_event(event="approval_asked", approval=asked["id"])
    # once: the next one asks again
    again = held.post("/echo/once")
    second = held.pending()
    assert second["id"] != asked["id"]
    held.decide(second["id"], "deny")
    assert held.done(again)[0] == 403


def test_a_denied_request_is_refused_and_opens_no_upstream_connection(held: Held) -> None:
    before = held.upstream.connections
    proc = held.post("/echo/denied")
    asked = held.pending()
    held.decide(asked["id"], "deny")
    code, body = held.done(proc)
    assert code == 403 and b"approval_denied" in body, body
    assert held.upstream.connections == before  # no TCP accept at the upstream
    assert held.seen("/echo/denied") == 0
    event = held.proxy.wait_event(event="request", path="/echo/denied")
    assert event["reason"] == "approval_denied"
    assert event["approval"] == {"id": asked["id"], "verdict": "deny", "scope": None}


@pytest.mark.parametrize("method", ["post", "Post"])
def test_a_post_spelled_otherwise_is_asked_too(held: Held, method: str) -> None:
    before = held.upstream.connections
    proc = held.post("/echo/spelled", method)
    asked = held.pending()
    assert asked["method"] == method
    held.decide(asked["id"], "deny")
    assert held.done(proc)[0] == 403
    assert held.upstream.connections == before and held.seen("/echo/spelled") == 0


def test_nobody_deciding_times_out(held: Held) -> None:
    before = held.upstream.connections
    started = time.monotonic()
    code, body = held.done(held.post("/t/slow"))
    assert code == 403 and b"approval_timeout" in body, body
    assert 1.4 <= time.monotonic() - started < 15
    assert held.upstream.connections == before
    with control(held.proxy) as api:
        closed = api.get("/approvals", params={"state": "timed_out"}).json()
    [gone] = [a for a in closed if a["path"] == "/t/slow"]
    event = held.proxy.wait_event(event="request", path="/t/slow")
    assert event["reason"] == "approval_timeout" and event["approval"]["id"] == gone["id"]


def test_a_for_grant_lets_the_next_through_until_revoked(held: Held) -> None:
    proc = held.post("/echo/granted")
    asked = held.pending()
    grant = held.decide(asked["id"], "approve", "for:10m")["grant"]
    assert held.done(proc)[0] == 200
    code, _ = held.done(held.post("/echo/granted"))  # no approval asked: it would wait 20 s
    assert code == 200 and held.seen("/echo/granted") == 2
    events = [e for e in held.proxy.audit_events() if e["event"] == "request"]
    events = [e for e in events if e.get("path") == "/echo/granted"]
    assert any(e.get("approval") == {"grant": grant["id"]} for e in events), events
    with control(held.proxy) as api:
        assert api.delete(f"/grants/{grant['id']}").status_code == 204
    third = held.post("/echo/granted")
    asked = held.pending()
    held.decide(asked["id"], "deny")
    assert held.done(third)[0] == 403 and held.seen("/echo/granted") == 2


def test_a_reload_that_now_refuses_refuses_the_held_request(held: Held) -> None:
    before = held.upstream.connections
    proc = held.post("/echo/reloaded")
    asked = held.pending()
    _reload(held, _rules(held.upstream.port, echo_methods=["GET"]))
    try:
        held.decide(asked["id"], "approve", "once")
        code, body = held.done(proc)
        # the rules in force now refuse a POST there (the closest rule names the path)
        assert code == 403 and b'"error": "path_not_allowed"' in body, body
        assert held.upstream.connections == before and held.seen("/echo/reloaded") == 0
        event = held.proxy.wait_event(event="request", path="/echo/reloaded")
        assert event["reason"] == "path_not_allowed"
        assert event["approval"] == {"id": asked["id"], "verdict": "approve", "scope": "once"}
    finally:
        _reload(held, _rules(held.upstream.port))


def _reload(held: Held, text: str) -> None:
    """Write the rules file and wait for the proxy's next applied reload."""

    def applied() -> int:
        events = held.proxy.audit_events()
        return sum(1 for e in events if e["event"] == "reload" and e.get("outcome") == "applied")

    seen = applied()
    held.proxy.rules.write_text(text)
    deadline = time.monotonic() + 10
    while applied() == seen:
        assert time.monotonic() < deadline, "the reload was not applied"
        time.sleep(0.05)


def test_a_client_that_goes_away_withdraws_its_approval(held: Held) -> None:
    before = held.upstream.connections
    proc = held.post("/echo/gone")
    asked = held.pending()
    proc.kill()
    held.done(proc)
    deadline = time.monotonic() + 10
    with control(held.proxy) as api:
        while time.monotonic() < deadline:
            state = {a["id"]: a["state"] for a in api.get("/approvals", params={"state": "all"}).json()}
            if state[asked["id"]] != "pending":
                break
            time.sleep(0.1)
    assert state[asked["id"]] == "withdrawn"
    assert held.upstream.connections == before and held.seen("/echo/gone") == 0
    # audited as the client's going, not as surrogate failing (a newcomer saw internal_error and
    # "approve failed with _Gone" on stderr)
    deadline = time.monotonic() + 10
    while not (events := [e for e in _events(held) if e.get("path") == "/echo/gone"]):
        assert time.monotonic() < deadline, "no audit event for the withdrawn request"
        time.sleep(0.1)
    assert events[-1]["reason"] == "client_closed", events[-1]
    assert "_Gone" not in held.proxy.stderr() and "approve failed" not in held.proxy.stderr()


def _events(held: Held) -> list[dict[str, object]]:
    lines = held.proxy.audit_path.read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip().endswith("}")]
