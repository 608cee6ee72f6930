"""docs/audit-schema.json documents every audit event surrogate writes, and real events match it.

The schema is checked against the code twice: its field names and enums against the constants
the code emits (proxy/audit.py, addons/audit.py, proxy/control/service.py, proxy.core.decide), and every line
a real proxy process wrote, driven through each kind of event, against the schema.
"""

from __future__ import annotations

import ast
import json
import secrets
import socket
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ROOT, ProxyProcess, dead_port
from jsonschema import Draft202012Validator
from ocsf_check import ocsf_errors
from servers import TestCA, Upstream

from proxy import audit
from proxy.cli.verify import read_lines
from proxy.core import chain
from proxy.core.decide import Action, Reason

SCHEMA_PATH = ROOT / "docs" / "audit-schema.json"
Event = dict[str, Any]


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema(), format_checker=Draft202012Validator.FORMAT_CHECKER)


def branch(kind: str) -> dict[str, Any]:
    return load_schema()["$defs"][kind]


def field_constants() -> dict[str, str]:
    """proxy.audit's field-name constants: upper-case module strings (not the logger's name)."""
    return {
        name: value
        for name, value in vars(audit).items()
        if name.isupper() and isinstance(value, str) and name != "LOGGER_NAME"
    }


def constants_used(source: Path) -> set[str]:
    """Values of the proxy.audit field constants that ``source`` refers to (``a.HOST`` …)."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "proxy"
        for alias in node.names
        if alias.name == "audit"
    }
    fields = field_constants()
    names = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
    }
    # `time`, `seq`, `worker` and `node` are added by processors in proxy.audit.configure, `prev` by
    # its sink (the hash chain), `event` is structlog's event name.
    added = {audit.TIME, audit.EVENT, audit.SEQ, audit.WORKER, audit.NODE, audit.PREV}
    return {fields[n] for n in names if n in fields} | added


# -- the schema against the code -------------------------------------------------------------


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)
    assert [b["$ref"] for b in schema["oneOf"]] == [
        "#/$defs/request",
        "#/$defs/tunnel",
        "#/$defs/control",
        "#/$defs/reload",
    ]


def test_date_time_format_is_really_checked() -> None:
    """jsonschema checks "date-time" only when rfc3339-validator is installed; silently otherwise."""
    assert "date-time" in Draft202012Validator.FORMAT_CHECKER.checkers, "install rfc3339-validator"
    assert not validator().is_valid(
        {
            "time": "2026-13-40T25:00:00Z",
            "event": "control",
            "who": "socket",
            "action": "claim.create",
            "claim": "c",
            "credential": None,
            "old_version": None,
            "new_version": 1,
            "seq": 1,
            "worker": 4242,
            "node": "node-a",
        }
    )


def test_reason_enum_is_proxy_decide_reason() -> None:
    assert set(load_schema()["$defs"]["reason"]["enum"]) == {r.value for r in Reason}


def test_decision_enum_is_proxy_decide_action() -> None:
    assert set(load_schema()["$defs"]["decision"]["enum"]) == {a.value for a in Action}


@pytest.mark.parametrize("kind", ["request", "tunnel"])
def test_flow_event_properties_are_the_fields_addons_audit_writes(kind: str) -> None:
    used = constants_used(ROOT / "addons" / "audit.py")
    assert set(branch(kind)["properties"]) == used
    assert set(branch(kind)["required"]) == used


def test_control_event_properties_are_the_fields_proxy_control_writes() -> None:
    used = constants_used(ROOT / "proxy" / "control" / "service.py")
    assert set(branch("control")["properties"]) == used
    assert set(branch("control")["required"]) == used


def test_every_field_constant_is_documented_with_a_description() -> None:
    documented = (
        set(branch("request")["properties"])
        | set(branch("control")["properties"])
        | set(branch("reload")["properties"])
    )
    assert documented == set(field_constants().values())
    defs = load_schema()["$defs"]
    for kind in ("request", "tunnel", "control", "reload"):
        for name, prop in branch(kind)["properties"].items():
            target = defs[prop["$ref"].rsplit("/", 1)[1]] if "$ref" in prop else prop
            assert prop.get("description") or target.get("description"), f"{kind}.{name}"


def test_control_action_enum_is_what_proxy_control_writes() -> None:
    tree = ast.parse((ROOT / "proxy" / "control" / "service.py").read_text(encoding="utf-8"))
    actions = {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "_audit"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
    }
    assert actions and set(branch("control")["properties"]["action"]["enum"]) == actions


GOOD_REQUEST: Event = {
    "time": "2026-05-01T12:00:00.123456Z",
    "event": "request",
    "request_id": "6f0c2a9e-0000-4000-8000-000000000000",
    "claim": "demo",
    "pool": "demo",
    "client": "127.0.0.1:51234",
    "method": "GET",
    "scheme": "https",
    "host": "api.github.com",
    "port": 443,
    "path": "/user?page=REDACTED&flag",
    "status": 200,
    "decision": "allow",
    "reason": "allowed",
    "rule": "demo.egress[0] api.github.com",
    "message": None,
    "seq": 7,
    "worker": 4242,
    "node": "node-a",
    "would_deny": None,
    "credentials": [{"name": "github", "version": 1}],
    "carried": [],
    "forged": [],
    "carried_on": [],
    "violation_surface": None,
    "bytes_out": 0,
    "bytes_in": 12,
    "duration_ms": 3.5,
    "prev": "5d41402abc4b2a76b9719d911017c592" * 2,
}


@pytest.mark.parametrize(
    "change",
    [
        {"value": "ghp_x"},
        {"path": "/user?page=2"},
        {"reason": "because"},
        {"decision": "deny"},
        {"message": "allowed by demo.egress[0] api.github.com"},
        {"credentials": [{"name": "github", "version": 1, "value": "ghp_x"}]},
        {"time": "2026-05-01 12:00"},
        {"event": "tunnel"},
        {"violation_surface": "cookie"},
        {"carried_on": [{"name": "github"}]},
        {"node": "node a"},
        {"node": ""},
        {"node": None},
        {"prev": "5D41402ABC4B2A76B9719D911017C592" * 2},
        {"prev": "abc"},
    ],
    ids=[
        "extra-field",
        "query-value-not-redacted",
        "unknown-reason",
        "deny-with-reason-allowed",
        "message-when-allowed",
        "credential-value",
        "time-not-rfc3339",
        "tunnel-with-a-path",
        "unknown-surface",
        "carried-without-surface",
        "node-not-a-label",
        "node-empty",
        "node-null",
        "prev-upper-case",
        "prev-not-a-sha256",
    ],
)
def test_schema_refuses_events_that_break_the_contract(change: Event) -> None:
    assert validator().is_valid(GOOD_REQUEST)
    assert not validator().is_valid({**GOOD_REQUEST, **change})


# -- real events from a real proxy -----------------------------------------------------------


def curl(proxy: ProxyProcess, proxy_url: str, url: str, *args: str, cacert: Path | None = None) -> str:
    """Run curl through the proxy; return "<http_code> <connect_code>" (e.g. "200 200", "000 407")."""
    cmd = ["curl", "-sS", "--max-time", "20", "-x", proxy_url, "-o", "/dev/null"]
    cmd += ["--cacert", str(cacert or proxy.ca_pem), "-w", "%{http_code} %{http_connect}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout


def wait_listening(path: Path, timeout: float = 10.0) -> None:
    # A plain probe first: httpx's UDS transport leaks its socket when connect() is refused.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                time.sleep(0.05)
    raise AssertionError(f"control socket {path} did not come up")


class World:
    def __init__(self, tmp: Path) -> None:
        self.secret = f"CANARYschema{secrets.token_hex(12)}"
        self.token = secrets.token_urlsafe(16)
        (tmp / "secret-gh").write_text(self.secret + "\n")
        (tmp / "token1").write_text(self.token + "\n")
        self.ca = TestCA(tmp)
        names = ["api.test", "other.test", "opaque.test", "dead.test"]
        self.upstream = Upstream(self.ca, names, tmpdir=tmp).start()
        port, self.dead_port = self.upstream.port, dead_port()  # bound, never listening
        rules = tmp / "rules.yaml"
        rules.write_text(
            textwrap.dedent(
                f"""\
                version: 1
                pools:
                  p:
                    egress:
                      - host: api.test
                        ports: [{port}]
                      - host: other.test
                        ports: [{port}]
                        paths: [/open]
                      - host: opaque.test
                        ports: [{port}]
                        intercept: false
                      - host: dead.test
                        ports: [{self.dead_port}]
                      - host: api.test
                        ports: [80]
                        scheme: http
                claims:
                  - id: c1
                    pool: p
                    proxy_token: file:token1
                    credentials:
                      - name: gh
                        value: file:secret-gh
                        placeholder: surr_SchemaPlaceholder000001
                        hosts: [api.test]
                """
            )
        )
        self.placeholder = "surr_SchemaPlaceholder000001"
        resolve = {n: "127.0.0.1" for n in names}
        self.proxy = ProxyProcess(rules, tmp, upstream_ca=self.ca.ca_pem, resolve=resolve)
        self.ocsf_path = tmp / "audit.ocsf.jsonl"
        self.proxy.args += ["--audit-ocsf-file", str(self.ocsf_path)]

    def url(self, host: str, path: str, port: int | None = None) -> str:
        return f"https://{host}:{port or self.upstream.port}{path}"

    @property
    def proxy_url(self) -> str:
        return self.proxy.url("c1", self.token)

    def api(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.proxy.state_dir / "control.sock"))
        return httpx.Client(transport=transport, base_url="http://control", timeout=10)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        w.proxy.start()
        wait_listening(w.proxy.state_dir / "control.sock")
        yield w
    finally:
        w.proxy.stop()
        w.upstream.stop()


def drive_every_kind_of_event(w: World) -> None:
    bearer = f"Authorization: Bearer {w.placeholder}"
    # allowed, the placeholder swapped for the secret
    assert curl(w.proxy, w.proxy_url, w.url("api.test", "/swapped?token=abc&x"), "-H", bearer) == "200 200"
    # allowed, the placeholder in the URL toward a bound host passes unchanged
    assert curl(w.proxy, w.proxy_url, w.url("api.test", f"/carried?key={w.placeholder}")) == "200 200"
    # violation: the placeholder toward a host its credential is not bound to
    assert curl(w.proxy, w.proxy_url, w.url("other.test", "/open"), "-H", bearer) == "403 200"
    # violation: the placeholder over cleartext http
    assert curl(w.proxy, w.proxy_url, "http://api.test/cleartext", "-H", bearer).startswith("403")
    # deny inside an intercepted tunnel
    assert curl(w.proxy, w.proxy_url, w.url("other.test", "/closed")) == "403 200"
    # 407 on the CONNECT: a wrong proxy token
    assert curl(w.proxy, w.proxy.url("c1", "wrong"), w.url("api.test", "/407")).endswith(" 407")
    # a CONNECT no rule allows
    assert curl(w.proxy, w.proxy_url, w.url("denied.test", "/denied")).endswith(" 403")
    # an opaque tunnel: the client verifies the upstream itself
    opaque = curl(w.proxy, w.proxy_url, w.url("opaque.test", "/opaque"), cacert=w.ca.ca_pem)
    assert opaque == "200 200"
    # an upstream nobody listens on
    assert curl(w.proxy, w.proxy_url, w.url("dead.test", "/dead", w.dead_port)) == "502 200"
    # every control-plane mutation, and a request with a credential from the store
    with w.api() as api:
        r = api.post("/v1/claims", json={"id": "runtime", "pool": "p"})
        assert r.status_code == 201, r.text
        token = r.json()["proxy_token"]
        r = api.put("/v1/claims/runtime/credentials/k", json={"hosts": ["api.test"], "value": w.secret})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
        proxy_url = w.proxy.url("runtime", token)
        headers = ["-H", f"X-Api-Key: {placeholder}"]
        assert curl(w.proxy, proxy_url, w.url("api.test", "/runtime"), *headers) == "200 200"
        r = api.patch("/v1/claims/runtime/credentials/k", json={"value": w.secret + "2"})
        assert r.status_code == 200, r.text
        assert api.post("/v1/claims/runtime/token").status_code == 200
        assert api.delete("/v1/claims/runtime/credentials/k").status_code == 204
        assert api.delete("/v1/claims/runtime").status_code == 204


CONTROL_ACTIONS = [
    "claim.create",
    "credential.put",
    "credential.patch",
    "claim.rotate_token",
    "credential.delete",
    "claim.delete",
]


def control_action(action: str) -> Callable[[Event], bool]:
    return lambda e: e["event"] == "control" and e["action"] == action


EXPECTED: dict[str, Callable[[Event], bool]] = {
    "allowed with a credential swapped": lambda e: (
        e["event"] == "request" and e["decision"] == "allow" and e["credentials"] != []
    ),
    "allowed with a placeholder carried": lambda e: e["event"] == "request" and e["carried"] != [],
    "placeholder violation": lambda e: e["event"] == "request" and e["reason"] == "placeholder_violation",
    "cleartext violation": lambda e: e["event"] == "request" and e["reason"] == "cleartext_credential",
    "request denied in a tunnel": lambda e: e["event"] == "request" and e["reason"] == "path_not_allowed",
    "407 on a CONNECT": lambda e: e["event"] == "tunnel" and e["status"] == 407,
    "denied CONNECT": lambda e: e["event"] == "tunnel" and e["reason"] == "no_rule",
    "opaque tunnel": lambda e: e["event"] == "tunnel" and e["decision"] == "allow",
    "upstream error": lambda e: e["event"] == "request" and e["reason"] == "upstream_error",
    **{f"control {action}": control_action(action) for action in CONTROL_ACTIONS},
}


def explain(v: Draft202012Validator, event: Event) -> list[str]:
    """Each schema error of ``event``, taken from the oneOf branch its ``event`` field names."""
    branch_index = {"request": 0, "tunnel": 1, "control": 2}.get(event.get("event"))
    out = []
    for err in v.iter_errors(event):
        subs = [s for s in err.context or [] if list(s.relative_schema_path)[:1] == [branch_index]]
        for e in subs or [err]:
            out.append(f"{event.get('event')} {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}")
    return out


@pytest.mark.e2e
def test_every_real_audit_line_matches_the_schema(world: World) -> None:
    drive_every_kind_of_event(world)
    deadline = time.monotonic() + 10  # flow events are written when the flow ends
    while time.monotonic() < deadline:
        events = world.proxy.audit_events()
        if all(any(seen(e) for e in events) for seen in EXPECTED.values()):
            break
        time.sleep(0.1)
    world.proxy.stop()
    text = world.proxy.audit_path.read_text(encoding="utf-8")
    assert world.secret not in text
    events = [json.loads(line) for line in text.splitlines()]  # every line is one JSON object
    v = validator()
    problems = [f"line {n}: {p}" for n, e in enumerate(events, 1) for p in explain(v, e)]
    assert problems == [], "\n".join(problems)
    missing = [kind for kind, seen in EXPECTED.items() if not any(seen(e) for e in events)]
    assert missing == [], f"never seen: {missing}\n{text}"

    # the same lines are one intact hash chain (docs/audit-schema.json "prev")
    lines = read_lines(world.proxy.audit_path)
    assert chain.verify(lines, audit.PREV).broken is None

    # ... and each request and tunnel event is also OCSF HTTP Activity the OCSF schema accepts
    ocsf_text = world.ocsf_path.read_text(encoding="utf-8")
    assert world.secret not in ocsf_text and world.placeholder not in ocsf_text
    mapped = [json.loads(line) for line in ocsf_text.splitlines()]
    flows = [e for e in events if e["event"] in ("request", "tunnel")]
    assert [m["metadata"].get("uid") for m in mapped] == [e["request_id"] for e in flows]
    ocsf_problems = [f"line {n}: {p}" for n, m in enumerate(mapped, 1) for p in ocsf_errors(m)]
    assert ocsf_problems == [], "\n".join(ocsf_problems)
