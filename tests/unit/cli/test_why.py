"""proxy.cli.why: an audited request, found by its id, explained from the rules in force; never a
secret value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.why import EGRESS, STAGES, main_why
from proxy.core.decide import Action, Reason, deny
from unit.cli.world import assert_no_secret, ns


def event(request_id: str, **fields: Any) -> dict[str, Any]:
    base = {
        "time": "2026-01-01T00:00:00Z", "event": "request", "request_id": request_id, "claim": "c1",
        "pool": "p", "client": "127.0.0.1:5000", "method": "GET", "scheme": "https", "host": "api.test",
        "port": 443, "path": "/repos", "status": 200, "decision": "allow", "reason": "allowed",
        "rule": "p.egress[0] api.test", "message": None, "credentials": [], "carried": [],
        "bytes_out": 0, "bytes_in": 0, "duration_ms": 1.0,
    }  # fmt: skip
    return {**base, **fields}


EVENTS = [
    event("r-allow"),
    event("r-method", method="DELETE", status=403, decision="deny", reason="method_not_allowed", rule=None,
          message="no egress rule of pool 'p' allows DELETE to api.test"),
    event("r-query", path="/repos?token=REDACTED&flag", carried=["gh"]),
    event("r-viol", host="other.test", path="/x", status=403, decision="violation",
          reason="placeholder_violation", rule="p.egress[1] other.test",
          message="placeholder of credential 'gh' in header Authorization is headed for other.test, "
          "which that credential is not bound to"),
    event("r-tunnel", event="tunnel", method="CONNECT", scheme=None, host="nowhere.example", path=None,
          status=403, decision="deny", reason="no_rule", rule=None, message="no egress rule ..."),
    event("r-opaque", event="tunnel", method="CONNECT", scheme=None, host="opaque.test", path=None,
          status=200, rule="p.egress[2] opaque.test"),
    event("r-stale", method="DELETE", rule="p.egress[0] api.test"),
    event("r-noauth", claim=None, pool=None, status=407, decision="deny", reason="proxy_auth_required",
          rule=None, message="proxy authentication required"),
    event("r-gone", claim="ghost"),
    event("r-421", status=421, decision="deny", reason="authority_mismatch", rule=None,
          message="Host header 'x.test' does not match the tunnel's host api.test:443"),
    {"time": "2026-01-01T00:00:00Z", "event": "control", "request_id": "r-control", "who": "socket",
     "action": "claim.create", "claim": "s1", "credential": None, "old_version": None, "new_version": 1},
]  # fmt: skip


@pytest.fixture
def audit_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    lines = [json.dumps(e) for e in EVENTS]
    path.write_text("not json\n" + "\n".join(lines) + '\n{"partial": ')
    return path


@pytest.mark.parametrize(
    ("request_id", "expect"),
    [
        ("r-allow", ["the rules in force decide as the proxy did"]),
        ("r-method", ["refused: deny method_not_allowed", "rule: none", "decide as the proxy did"]),
        ("r-query", ["query values are REDACTED", "decide as the proxy did"]),
        ("r-viol", ["refused: violation placeholder_violation", "rule: p.egress[1] other.test",
                    "header values are never logged", "decided at: substitution",
                    "the egress rules in force: allow (rule p.egress[1] other.test)",
                    "the egress rules in force allow this request, as they did then; the proxy refused "
                    "it at substitution (placeholder_violation)"]),
        ("r-tunnel", ["CONNECT nowhere.example:443: deny no_rule", "decide as the proxy did"]),
        ("r-opaque", ["tunnel: opaque", "decide as the proxy did"]),
        ("r-stale", ["decide differently"]),
        ("r-noauth", ["not identified as any claim"]),
        ("r-gone", ["cannot replay: no claim 'ghost'", "pass --state-dir for control-API claims",
                    "whether the rules in force decide as the proxy did is not known"]),
        ("r-421", ["decided at: request checks", "at request checks (authority_mismatch), outside"]),
        ("r-control", ["control-API mutation (claim.create by socket)"]),
    ],
)  # fmt: skip
def test_why(
    rules_file: Path, audit_file: Path, request_id: str, expect: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main_why(ns(request_id=request_id, audit_file=audit_file, rules=rules_file)) == 0
    out = capsys.readouterr().out
    assert f'"request_id": "{request_id}"' in out
    for text in expect:
        assert text in out
    assert_no_secret(out)


def test_a_claim_not_in_the_rules_is_unknown_without_the_store_and_gone_with_it(
    rules_file: Path, audit_file: Path, state_dir: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A newcomer's `audit why` on a control-API claim without --state-dir was told the rules "decide
    differently" (and that the rules or the store had changed): without the store nothing could be
    compared. With the store read, a claim in neither is gone, and that is a difference."""
    assert main_why(ns(request_id="r-gone", audit_file=audit_file, rules=rules_file, json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agrees"] is None
    assert main_why(ns(request_id="r-gone", audit_file=audit_file, rules=rules_file)) == 0
    assert "decide differently" not in capsys.readouterr().out
    state, _ = state_dir
    args = ns(request_id="r-gone", audit_file=audit_file, rules=rules_file, state_dir=state)
    assert main_why(args) == 0
    out = capsys.readouterr().out
    assert "cannot replay: no claim 'ghost'" in out and "decide differently" in out
    assert "pass --state-dir" not in out


def test_why_json(rules_file: Path, audit_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_why(ns(request_id="r-viol", audit_file=audit_file, rules=rules_file, json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agrees"] is True and doc["event"]["request_id"] == "r-viol"
    assert doc["explanation"]["request"]["rule"] == "p.egress[1] other.test"


def test_why_unknown_id_exits_1(
    rules_file: Path, audit_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main_why(ns(request_id="nope", audit_file=audit_file, rules=rules_file)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no audit event with request_id 'nope'" in captured.err


# --- refusals outside the egress rules are explained as what they were (issue 18 item 5) ------


def test_every_reason_has_its_place() -> None:
    """A reason code added to proxy/core/decide.py must be given its stage here too."""
    assert set(Reason) == EGRESS | set(STAGES)
    assert not EGRESS & set(STAGES)


# Each reason outside the egress rules with the decision the proxy audits it with; the two that
# are also audited as allowed (a hook's answer; a client that left after a stream's last event)
# appear that way too.
OUTSIDE = [(r, deny(r, "m").action) for r in Reason if r not in EGRESS and r is not Reason.HOOK_ANSWERED]
OUTSIDE += [(Reason.HOOK_ANSWERED, Action.ALLOW), (Reason.CLIENT_CLOSED, Action.ALLOW)]


@pytest.mark.parametrize(("reason", "action"), OUTSIDE, ids=[f"{r.value}-{a.value}" for r, a in OUTSIDE])
def test_why_never_calls_a_refusal_outside_the_egress_rules_allowed(
    reason: Reason, action: Action, rules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The egress rules allow the request (rule p.egress[0]); the proxy refused it (or answered
    it) at another step: the replay says what the egress rules say and which step decided, never
    "verdict: allow" nor that the rules decide as the proxy did."""
    refused = action is not Action.ALLOW
    ev = event(
        f"r-{reason.value}", decision=action.value, reason=reason.value, status=403 if refused else 200,
        message=f"refused: {reason.value}" if refused else None,
    )  # fmt: skip
    audit_file = tmp_path / "one.jsonl"
    audit_file.write_text(json.dumps(ev) + "\n")
    assert main_why(ns(request_id=ev["request_id"], audit_file=audit_file, rules=rules_file)) == 0
    out = capsys.readouterr().out
    stage, checked = STAGES[reason]
    assert f"decided at: {stage}: {checked}" in out
    assert "verdict:" not in out and "decide as the proxy did" not in out
    assert "the egress rules in force: allow (rule p.egress[0] api.test)" in out
    assert (f"refused: {action.value} {reason.value}" in out) is refused
    assert f"at {stage} ({reason.value})" in out
    assert_no_secret(out)
    assert main_why(ns(request_id=ev["request_id"], audit_file=audit_file, rules=rules_file, json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stage"] == {"name": stage, "checked": checked}
    assert doc["outside_egress"] is True


@pytest.mark.parametrize("reason", sorted(EGRESS - {Reason.ALLOWED}), ids=lambda r: r.value)
def test_an_egress_refusal_is_replayed_as_the_proxy_decided_it(
    reason: Reason, rules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusals the egress rules make are replayed whole: the verdict, and whether the rules
    in force agree (here they do not: the rules allow GET /repos)."""
    ev = event("r-egress", decision="deny", reason=reason.value, status=403, rule=None, message="m")
    audit_file = tmp_path / "one.jsonl"
    audit_file.write_text(json.dumps(ev) + "\n")
    assert main_why(ns(request_id="r-egress", audit_file=audit_file, rules=rules_file, json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outside_egress"] is False and doc["stage"]["name"] == "egress rules"
    assert doc["explanation"]["decision"] == "allow" and doc["agrees"] is False
