"""``rules explain`` and ``audit why`` agree with a real proxy process.

Real curl requests go through a real proxy to a real HTTPS upstream; then explain is run on each
request and its decision, reason, rule, credential names and carried names are compared with the
proxy's own audit event for that request. A refused request's request id leads ``audit why`` to
the same reason and rule. The credential values are canaries, checked to appear in no explain or
why output, no audit line and no proxy log.
"""

from __future__ import annotations

import argparse
import json
import secrets
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import canary
import httpx
import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, control, credential, egress, rules

from proxy.audit import redact_path
from proxy.cli.explain import EXIT, main_explain
from proxy.cli.why import main_why
from proxy.core.decide import Action

pytestmark = pytest.mark.e2e

NAMES = ["api.test", "other.test", "opaque.test"]
P_GH = "surr_ExplainGithubPlaceholder01"
P_INJ = "surr_ExplainInjectedPlaceholder2"


@dataclass
class World:
    upstream: Upstream
    upstream_ca: Path
    proxy: ProxyProcess
    rules: Path
    token: str
    canaries: list[str]
    received: list[bytes] = field(default_factory=list)

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.upstream.port}{path}"


def rules_text(port: int) -> str:
    return rules(
        [
            egress("api.test", port, methods=["GET", "POST"], paths=["/t"]),
            egress("other.test", port),
            egress("opaque.test", port, intercept=False),
            egress("api.test", 80, scheme="http"),
            egress("*.test", port, intercept=False),
        ],
        credentials=[
            credential("gh", P_GH, ["api.test"]),
            credential(
                "inj", P_INJ, ["api.test"], inject={"set_header": "X-Injected", "format": "Token {value}"}
            ),
        ],
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("explain")) as st:
        st.secret("gh", tag="xgh"), st.secret("inj", tag="xinj")
        token = st.token(secrets.token_urlsafe(16))
        upstream = st.upstream(NAMES)
        proxy = st.proxy(rules_text(upstream.port), NAMES, control=True)
        # explain/why output joins the client-received bytes in the closing canary check
        yield World(upstream, st.ca.ca_pem, proxy, proxy.rules, token, st.canaries, st.received)


def curl(w: World, method: str, url: str, headers: list[str], *, claim: str = "c1", token: str = "") -> int:
    opaque = url.startswith("https://opaque.test")
    cmd = ["curl", "-sS", "--max-time", "20", "-x", w.proxy.url(claim, token or w.token), "-X", method]
    # an opaque tunnel: the client talks TLS with the upstream itself
    cmd += ["--cacert", str(w.upstream_ca if opaque else w.proxy.ca_pem), "-w", "\n%{http_code}"]
    for h in headers:
        cmd += ["-H", h]
    done = subprocess.run([*cmd, url], capture_output=True, timeout=30, check=False)
    w.received.append(done.stdout + done.stderr)
    return int(done.stdout.rsplit(b"\n", 1)[-1])


def explain_json(w: World, capsys: pytest.CaptureFixture[str], **kw: Any) -> dict[str, Any]:
    args = argparse.Namespace(**{"rules": w.rules, "claim": "c1", "header": [], "state_dir": None, **kw})
    args.json = True
    status = main_explain(args)
    out = capsys.readouterr().out
    w.received.append(out.encode())
    doc: dict[str, Any] = json.loads(out)
    assert status == EXIT[Action(doc["decision"])]  # the exit status says the verdict
    return doc


@dataclass(frozen=True)
class Case:
    method: str
    url: str  # "{port}" is the upstream's port
    headers: tuple[str, ...]
    match: tuple[tuple[str, Any], ...]  # how to find the proxy's audit event
    status: int  # what curl sees (0: the CONNECT was refused, so no response to the request)


CASES = [
    pytest.param(
        Case("GET", "https://api.test:{port}/t/allow", (), (("path", "/t/allow"),), 200),
        id="allowed",
    ),
    pytest.param(
        Case("GET", "https://denied.example:{port}/x", (), (("host", "denied.example"), ("event", "tunnel")),
             0),
        id="denied-host",
    ),
    pytest.param(
        Case("DELETE", "https://api.test:{port}/t/method", (), (("path", "/t/method"),), 403),
        id="denied-method",
    ),
    pytest.param(
        Case("GET", "https://api.test:{port}/admin/path", (), (("path", "/admin/path"),), 403),
        id="denied-path-intercepted-only",
    ),
    pytest.param(
        Case("GET", "https://other.test:{port}/t/violation", (f"Authorization: Bearer {P_GH}",),
             (("path", "/t/violation"),), 403),
        id="violation",
    ),
    pytest.param(
        Case("GET", "https://api.test:{port}/t/carried?token=" + P_GH, (),
             (("path", "/t/carried?token=REDACTED"),), 200),
        id="carried",
    ),
    pytest.param(
        Case("POST", "https://api.test:{port}/t/swap", (f"X-Api-Key: {P_GH}", "X-Injected: mine"),
             (("path", "/t/swap"),), 200),
        id="swap-and-injection",
    ),
    pytest.param(
        Case("GET", "https://git:" + P_GH + "@api.test:{port}/t/basic", (), (("path", "/t/basic"),), 200),
        id="basic-from-url",
    ),
    pytest.param(
        Case("GET", "https://opaque.test:{port}/t/opaque", (f"Authorization: Bearer {P_GH}",),
             (("host", "opaque.test"), ("event", "tunnel")), 200),
        id="opaque-tunnel",
    ),
    pytest.param(
        # methods are case-sensitive: "get" is not the rule's GET (was: decided as GET, sent as get)
        Case("get", "https://api.test:{port}/t/lower", (), (("path", "/t/lower"),), 403),
        id="lower-case-method",
    ),
    pytest.param(
        Case("GET", "http://api.test/t/cleartext", (f"Authorization: Bearer {P_GH}",),
             (("path", "/t/cleartext"),), 403),
        id="cleartext",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_explain_agrees_with_the_proxy(world: World, case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    url = case.url.replace("{port}", str(world.upstream.port))
    status = curl(world, case.method, url, list(case.headers))
    assert status == case.status
    event = world.proxy.wait_event(**dict(case.match))
    doc = explain_json(world, capsys, method=case.method, url=url, header=list(case.headers))
    fields = ("event", "decision", "reason", "rule", "host", "port")
    assert {k: doc[k] for k in fields} == {k: event[k] for k in fields}
    assert {c["name"] for c in doc["credentials"]} == {c["name"] for c in event["credentials"]}
    assert doc["carried"] == event["carried"]
    if event["event"] == "request":
        explained = (doc["method"], redact_path(doc["path"]), doc["scheme"])
        assert explained == (event["method"], event["path"], event["scheme"])
    if event["decision"] != "allow":
        # curl speaks HTTP/2 to the proxy, which lower-cases header names in the proxy's sentence
        assert doc["message"].lower() == event["message"].lower()
        assert doc["status"] == event["status"]


def refused(world: World, url: str, method: str = "GET", headers: dict[str, str] | None = None) -> str:
    ctx = ssl.create_default_context(cafile=world.proxy.ca_pem)
    with httpx.Client(proxy=world.proxy.url("c1", world.token), verify=ctx, timeout=10) as client:
        r = client.request(method, url, headers=headers)
    world.received.append(r.content)
    assert r.status_code == 403
    request_id: str = r.json()["request_id"]
    assert r.headers["X-Surrogate-Request-Id"] == request_id
    return request_id


def why(world: World, capsys: pytest.CaptureFixture[str], request_id: str, as_json: bool = False) -> str:
    world.proxy.wait_event(request_id=request_id)
    args = argparse.Namespace(
        request_id=request_id,
        audit_file=world.proxy.audit_path,
        rules=world.rules,
        state_dir=None,
        json=as_json,
    )
    assert main_why(args) == 0
    out = capsys.readouterr().out
    world.received.append(out.encode())
    return out


def test_why_blocked_names_the_reason_and_rule(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    request_id = refused(world, world.url("api.test", "/t/why-method"), method="DELETE")
    out = why(world, capsys, request_id)
    assert "refused: deny method_not_allowed" in out and "rule: none" in out
    assert "request DELETE /t/why-method: deny method_not_allowed" in out
    assert "the rules in force decide as the proxy did" in out

    request_id = refused(world, world.url("other.test", "/t/why-viol?q=1"), headers={"X-Key": P_GH})
    doc = json.loads(why(world, capsys, request_id, as_json=True))
    assert doc["event"]["reason"] == "placeholder_violation"
    assert doc["event"]["rule"] == doc["explanation"]["request"]["rule"] == "p.egress[1] other.test"
    assert doc["agrees"] is True
    assert any("REDACTED" in n for n in doc["notes"])


def test_why_unknown_request_id_exits_1(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        request_id="no-such-id",
        audit_file=world.proxy.audit_path,
        rules=world.rules,
        state_dir=None,
        json=False,
    )
    assert main_why(args) == 1
    assert "no audit event with request_id 'no-such-id'" in capsys.readouterr().err


def test_explain_sees_control_api_claims_with_state_dir(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    value = canary.make("xstore")
    world.canaries.append(value)
    with control(world.proxy) as api:
        token = api.post("/v1/claims", json={"id": "s7", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/s7/credentials/st", json={"hosts": ["api.test"], "value": value})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
    url, headers = world.url("api.test", "/t/store"), [f"Authorization: Bearer {placeholder}"]
    assert curl(world, "GET", url, headers, claim="s7", token=token) == 200
    event = world.proxy.wait_event(path="/t/store")
    doc = explain_json(
        world, capsys, claim="s7", method="GET", url=url, header=headers, state_dir=world.proxy.state_dir
    )
    assert (doc["decision"], doc["rule"]) == (event["decision"], event["rule"])
    assert doc["credentials"] == [{"name": "st", "header": "Authorization", "how": "swapped"}]
    assert [c["name"] for c in event["credentials"]] == ["st"]
