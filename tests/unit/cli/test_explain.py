"""proxy.cli.explain: a dry run through the proxy's own core calls names the rule, the reason and the
credentials' headers, and never a secret value."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.cli.explain import Explanation, explain, main_explain, parse_header, render, to_json
from proxy.cli.main import main as cli_main
from proxy.core import templates
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Claim, Policy
from proxy.core.secrets import Secret
from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store
from unit.cli.world import P_GH, P_OTHER, assert_no_secret, ns

INJ = ("inj", "X-Injected")


@dataclass(frozen=True)
class Row:
    method: str
    url: str
    headers: tuple[str, ...]
    event: str
    decision: str
    reason: str
    rule: str | None
    tunnel: str | None = None
    placed: frozenset[tuple[str, str]] = frozenset()
    carried: tuple[str, ...] = ()
    message: str = ""


ROWS = [
    pytest.param(
        Row("GET", "https://api.test/repos/x", (), "request", "allow", "allowed", "p.egress[0] api.test",
            "intercepted", frozenset({INJ})),
        id="allow-intercepted-with-injection",
    ),
    pytest.param(
        Row("get", "https://api.test/repos", (), "request", "deny", "method_not_allowed", None,
            "intercepted", frozenset()),
        id="methods-are-case-sensitive",
    ),
    pytest.param(
        Row("GET", "https://nowhere.example/", (), "tunnel", "deny", "no_rule", None),
        id="no-rule-connect-refused",
    ),
    pytest.param(
        Row("GET", "https://api.test:8443/repos", (), "tunnel", "deny", "port_not_allowed", None),
        id="port-not-allowed-at-connect",
    ),
    pytest.param(
        Row("DELETE", "https://api.test/repos", (), "request", "deny", "method_not_allowed", None,
            "intercepted", message="allows DELETE to api.test"),
        id="method-denied-inside-tunnel",
    ),
    pytest.param(
        # the later "*.test" intercept: false rule would allow it, but not inside an intercepted tunnel
        Row("GET", "https://api.test/admin", (), "request", "deny", "path_not_allowed", None, "intercepted"),
        id="path-denied-intercepted-only",
    ),
    pytest.param(
        Row("GET", "https://other.test/x", (f"Authorization: Bearer {P_GH}",), "request", "violation",
            "placeholder_violation", "p.egress[1] other.test", "intercepted",
            message="credential 'gh' in header Authorization is headed for other.test"),
        id="violation-header-toward-unbound-host",
    ),
    pytest.param(
        Row("GET", f"https://other.test/x?t={P_GH}", (), "request", "violation", "placeholder_violation",
            "p.egress[1] other.test", "intercepted", message="in request target"),
        id="violation-url-toward-unbound-host",
    ),
    pytest.param(
        Row("GET", f"https://api.test/repos?token={P_GH}", (), "request", "allow", "allowed",
            "p.egress[0] api.test", "intercepted", frozenset({INJ}), ("gh",)),
        id="carried-in-query-toward-bound-host",
    ),
    pytest.param(
        Row("POST", "https://api.test/user", (f"Authorization: Bearer {P_GH}",), "request", "allow",
            "allowed", "p.egress[0] api.test", "intercepted", frozenset({("gh", "Authorization"), INJ})),
        id="swap-in-header-and-injection",
    ),
    pytest.param(
        Row("GET", f"https://git:{P_GH}@api.test/repos", (), "request", "allow", "allowed",
            "p.egress[0] api.test", "intercepted", frozenset({("gh", "Authorization"), INJ})),
        id="swap-in-basic-credentials-from-url",
    ),
    pytest.param(
        Row("GET", "https://api.test/repos", ("X-Injected: sandbox-chosen",), "request", "allow",
            "allowed", "p.egress[0] api.test", "intercepted", frozenset({INJ})),
        id="injection-replaces-the-sandbox-header",
    ),
    pytest.param(
        Row("GET", "https://api.test/repos", (f"Authorization: Bearer {P_OTHER}",), "request", "allow",
            "allowed", "p.egress[0] api.test", "intercepted", frozenset({INJ})),
        id="another-claims-placeholder-is-plain-text",
    ),
    pytest.param(
        Row("GET", "https://opaque.test/", (f"Authorization: Bearer {P_GH}",), "tunnel", "allow",
            "allowed", "p.egress[2] opaque.test", "opaque"),
        id="opaque-tunnel-no-credential",
    ),
    pytest.param(
        Row("GET", "http://api.test/repos", (f"Authorization: Bearer {P_GH}",), "request", "violation",
            "cleartext_credential", "p.egress[3] api.test", message="cleartext HTTP"),
        id="cleartext-http-with-placeholder",
    ),
    pytest.param(
        Row("GET", "http://api.test/anything", (), "request", "allow", "allowed", "p.egress[3] api.test"),
        id="cleartext-http-no-injection",
    ),
    pytest.param(
        Row("GET", "https://api.test/repos", ("Host: other.test",), "request", "deny", "authority_mismatch",
            None, "intercepted", message="does not match the tunnel's host api.test:443"),
        id="host-header-disagrees",
    ),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS)
def test_explain(policy: Policy, row: Row) -> None:
    e = explain(policy, "c1", row.method, row.url, [parse_header(h) for h in row.headers], now=0.0)
    rule = e.verdict.rule.label() if e.verdict.rule else None
    assert (e.event, e.verdict.action.value, e.verdict.reason.value, rule) == (
        row.event,
        row.decision,
        row.reason,
        row.rule,
    )
    assert e.tunnel == row.tunnel
    assert {(p.credential, p.header) for p in e.placements} == row.placed
    assert e.carried == row.carried
    assert row.message in e.verdict.message
    if row.url.startswith("https"):
        assert e.connect is not None
    text, data = render(e), json.dumps(to_json(e))
    assert_no_secret(text, data, repr(e))
    assert f"verdict: {row.decision}" in text
    doc = to_json(e)
    assert (doc["decision"], doc["reason"], doc["rule"], doc["event"]) == (
        row.decision,
        row.reason,
        row.rule,
        row.event,
    )
    assert {(c["name"], c["header"]) for c in doc["credentials"]} == row.placed


def test_render_names_headers_and_how(policy: Policy) -> None:
    e = explain(policy, "c1", "GET", f"https://git:{P_GH}@api.test/repos?x={P_GH}", now=0.0)
    text = render(e)
    assert "credential gh: swapped in Basic credentials in header Authorization" in text
    assert "credential inj: injected (format 'Token {value}') in header X-Injected" in text
    assert "carried unchanged (found where its credential is not swapped)" in text and "gh" in text
    assert "CONNECT api.test:443: allow (rule p.egress[0] api.test)" in text


def test_another_claims_placeholder_is_noted(policy: Policy) -> None:
    e = explain(policy, "c1", "GET", "https://api.test/repos", [("X-Key", P_OTHER)], now=0.0)
    assert any(P_OTHER in n and "not a placeholder of claim 'c1'" in n for n in e.notes)


def test_a_lower_case_method_is_decided_as_sent_and_said(policy: Policy) -> None:
    """Was: the proxy decided on mitmproxy's upper-cased method but forwarded the raw one."""
    e = explain(policy, "c1", "get", "https://api.test/repos", now=0.0)
    assert (e.method, e.verdict.reason.value) == ("get", "method_not_allowed")
    assert any("case-sensitive" in n for n in e.notes)


def test_proxy_headers_are_dropped(policy: Policy) -> None:
    e = explain(policy, "c1", "GET", "https://other.test/", [("Proxy-Authorization", P_GH)], now=0.0)
    assert e.verdict.allowed  # the proxy strips Proxy-* before substitution sees the headers
    assert any("Proxy-*" in n for n in e.notes)


class Boom:
    """A value source that fails the test if anything reads it."""

    def current(self) -> tuple[Secret, int]:
        raise AssertionError("explain read a secret")


def _with_sources(policy: Policy, **changes: Any) -> Policy:
    claims = {}
    for cid, c in policy.claims.items():
        creds = tuple(dataclasses.replace(k, source=Boom(), **changes) for k in c.credentials)
        claims[cid] = Claim.build(c.id, c.pool, c.proxy_token, creds, c.origin, c.sources)
    return Policy(policy.source, policy.pools, claims)


def test_no_secret_is_read(policy: Policy) -> None:
    e = explain(_with_sources(policy), "c1", "GET", "https://api.test/repos", [("Authorization", P_GH)])
    assert {p.credential for p in e.placements} == {"gh", "inj"}


def test_expired_credential_is_refused(policy: Policy) -> None:
    e = explain(_with_sources(policy, expires_at=100.0), "c1", "GET", "https://api.test/repos", now=200.0)
    assert (e.verdict.reason.value, e.verdict.rule.label() if e.verdict.rule else None) == (
        "credential_expired",
        "p.egress[0] api.test",
    )
    assert e.substitution == e.verdict


def test_pool_missing_fails_closed(policy: Policy) -> None:
    c = policy.claims["c1"]
    claims = {"c9": Claim.build("c9", "gone", c.proxy_token, ())}
    e = explain(Policy(policy.source, policy.pools, claims), "c9", "GET", "https://api.test/repos")
    assert (e.event, e.verdict.reason.value, e.verdict.status) == ("tunnel", "internal_error", 400)


@pytest.mark.parametrize(
    ("claim", "url", "match"),
    [
        ("nobody", "https://api.test/", "no claim 'nobody'"),
        ("c1", "ftp://api.test/", "not an http:// or https:// URL"),
        ("c1", "https:///nohost", "not an http:// or https:// URL"),
        ("c1", "https://api.test:99999/", "invalid port"),
    ],
    ids=["unknown-claim", "not-http", "no-host", "bad-port"],
)
def test_bad_input_is_a_clear_error(policy: Policy, claim: str, url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        explain(policy, claim, "GET", url)


def test_bad_header_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="is not 'Name: value'"):
        parse_header("no colon here")


def test_store_claims_through_a_registry(policy: Policy, state_dir: tuple[Path, str]) -> None:
    state, placeholder = state_dir
    with Store.open(state / "store.sqlite3", KeyRing.load_or_create(state / "store.key")) as store:
        registry = Registry(policy, store)
        registry.refresh()
        e = explain(registry, "s1", "GET", "https://api.test/user", [("X-Api-Key", placeholder)])
        bad = explain(registry, "s1", "GET", "https://other.test/", [("X-Api-Key", placeholder)])
    assert [(p.credential, p.header, p.how) for p in e.placements] == [("st", "X-Api-Key", "swapped")]
    assert bad.verdict.reason.value == "placeholder_violation"
    assert_no_secret(render(e), render(bad))


def test_main_explain_text_and_json(rules_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ns(rules=rules_file, claim="c1", method="GET", url="https://api.test/repos")
    assert main_explain(args) == 0
    assert "verdict: allow (rule p.egress[0] api.test)" in capsys.readouterr().out
    args = ns(rules=rules_file, claim="c1", method="DELETE", url="https://api.test/repos", json=True)
    assert main_explain(args) == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["decision"], doc["reason"], doc["connect"]["decision"]) == (
        "deny",
        "method_not_allowed",
        "allow",
    )


def test_main_explain_with_state_dir(
    rules_file: Path, state_dir: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, placeholder = state_dir
    header = [f"Authorization: Bearer {placeholder}"]
    args = ns(rules=rules_file, claim="s1", method="GET", url="https://api.test/user", header=header)
    args.state_dir, args.json = state, True
    assert main_explain(args) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["credentials"] == [{"name": "st", "header": "Authorization", "how": "swapped"}]
    assert_no_secret(out)


def test_state_dir_without_a_store_is_refused(rules_file: Path, tmp_path: Path) -> None:
    args = ns(
        rules=rules_file, claim="c1", method="GET", url="https://api.test/", state_dir=tmp_path / "none"
    )
    with pytest.raises(ValueError, match="no credential store"):
        main_explain(args)
    assert not (tmp_path / "none").exists()  # a dry run creates nothing


def test_explanation_is_frozen(policy: Policy) -> None:
    e: Explanation = explain(policy, "c1", "GET", "https://api.test/repos", now=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.claim = "c2"  # type: ignore[misc]


def test_a_broken_source_never_matters(policy: Policy) -> None:
    """Even a source that cannot be read gives an explanation (the proxy would answer 503)."""

    class Gone:
        def current(self) -> tuple[Secret, int]:
            raise SecretUnavailable("gone")

    c = policy.claims["c1"]
    creds = tuple(dataclasses.replace(k, source=Gone()) for k in c.credentials)
    claims = {"c1": Claim.build("c1", "p", c.proxy_token, creds)}
    e = explain(Policy(policy.source, policy.pools, claims), "c1", "GET", "https://api.test/repos")
    assert e.verdict.allowed
    assert any("credential_unavailable" in n for n in e.notes)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://api.test/%72epos/x", "allowed"),  # /%72epos is /repos, as the proxy reads it
        ("https://api.test/repos/%2e%2e/admin", "ambiguous_path"),
        ("https://api.test/repos%2Fx", "ambiguous_path"),
        ("https://other.test/a%2Fb", "allowed"),  # nothing on other.test matches on paths
    ],
    ids=["encoded-letter", "encoded-dot-dot", "encoded-slash", "no-path-matcher-on-host"],
)
def test_explain_reads_the_path_as_the_proxy_does(policy: Policy, url: str, reason: str) -> None:
    exp = explain(policy, "c1", "GET", url, [])
    assert exp.verdict.reason.value == reason
    if reason == "ambiguous_path":
        assert exp.verdict.status == 400 and "/admin" not in exp.verdict.message


# --- exit status (issue 18 item 8) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "status", "verdict"),
    [
        (["GET", "https://api.test/repos"], 0, "verdict: allow"),
        (["GET", "https://opaque.test/"], 0, "tunnel: opaque"),
        (["DELETE", "https://api.test/repos"], 3, "verdict: deny method_not_allowed"),
        (["GET", "https://nowhere.example/"], 3, "verdict: deny no_rule"),
        (["GET", "https://other.test/x", "-H", f"Authorization: Bearer {P_GH}"], 4,
         "verdict: violation placeholder_violation"),
        (["GET", "http://api.test/repos", "-H", f"Authorization: Bearer {P_GH}"], 4,
         "verdict: violation cleartext_credential"),
    ],
    ids=["allow", "opaque", "deny-method", "deny-no-rule", "violation", "cleartext"],
)  # fmt: skip
def test_rules_explain_exit_status_says_the_verdict(
    argv: list[str], status: int, verdict: str, rules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["rules", "explain", "--rules", str(rules_file), "--claim", "c1", *argv]) == status
    assert verdict in capsys.readouterr().out


def test_rules_explain_exit_status_of_an_error_verdict(
    rules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store claim whose pool the rules file no longer defines: the proxy fails closed (5)."""
    state = tmp_path / "state-gone"
    state.mkdir()
    with Store.open(state / "store.sqlite3", KeyRing.load_or_create(state / "store.key")) as store:
        store.create_claim("g1", "gone")
    argv = ["rules", "explain", "--rules", str(rules_file), "--state-dir", str(state), "--claim", "g1"]
    assert cli_main([*argv, "GET", "https://api.test/repos"]) == 5
    assert "verdict: error internal_error" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (["--claim", "nobody", "GET", "https://api.test/"], 1, "no claim 'nobody'"),
        (["--claim", "c1", "GET", "ftp://api.test/"], 1, "is not an http:// or https:// URL"),
        (["--claim", "c1", "GET", "https://api.test/", "-H", "no colon"], 1, "is not 'Name: value'"),
        (["GET", "https://api.test/"], 2, "the following arguments are required: --claim"),
    ],
    ids=["unknown-claim", "bad-url", "bad-header", "usage"],
)
def test_rules_explain_exit_status_of_input_it_cannot_explain(
    argv: list[str], status: int, said: str, rules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if status == 2:
        with pytest.raises(SystemExit) as exited:
            cli_main(["rules", "explain", "--rules", str(rules_file), *argv])
        assert exited.value.code == 2
    else:
        assert cli_main(["rules", "explain", "--rules", str(rules_file), *argv]) == status
    assert said in capsys.readouterr().err


def test_rules_explain_exit_status_of_a_rules_file_that_does_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\npools: {p: {egress: [{host: a.test, ports: [0]}]}}\n")
    assert cli_main(["rules", "explain", "--rules", str(bad), "--claim", "c", "GET", "https://a.test/"]) == 1
    assert f"{bad}:2:" in capsys.readouterr().err


def test_rules_explain_help_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["rules", "explain", "--help"])
    out = capsys.readouterr().out
    for line in (
        "0  allow",
        "3  deny",
        "4  violation",
        "5  error",
        "1  the input cannot be explained",
        "2  usage",
    ):
        assert line in out


def test_explain_says_a_request_an_ask_rule_covers_asks_for_approval(tmp_path: Path) -> None:
    from proxy.rules.loader import load_rules  # noqa: PLC0415 - only this test loads its own file

    path = tmp_path / "r.yaml"
    path.write_text(
        "version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n"
        "        approve: {methods: [POST], paths: [/v1], timeout: 30, scopes: [once, for]}\n"
        "claims:\n  - {id: c1, pool: p, proxy_token: 'file:token'}\n"
    )
    (tmp_path / "token").write_text("tok-explain-0001\n")
    policy = load_rules(path)
    asked = explain(policy, "c1", "POST", "https://api.test/v1/x", [], now=0.0)
    assert asked.verdict.allowed
    [note] = [n for n in asked.notes if n.startswith("asks for approval")]
    assert "p.egress[0]" in note and "30 s" in note and "once, for" in note
    assert "asks for approval" in render(asked)
    unasked = explain(policy, "c1", "GET", "https://api.test/v1/x", [], now=0.0)
    assert not [n for n in unasked.notes if n.startswith("asks for approval")]


def test_explain_names_the_template_of_a_format_valid_placeholder(tmp_path: Path) -> None:
    """Issue 15: a credential whose placeholder is of a shipped template is said to be (the
    template and its shape; neither the placeholder's characters beyond that nor any value)."""
    ph = templates.mint(templates.SHIPPED["github_classic"])
    (tmp_path / "tok").write_text("t\n")
    (tmp_path / "s").write_text("CANARYexplain-template-01\n")
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "version: 1\npools:\n  p:\n    egress:\n      - host: api.github.com\n"
        "claims:\n  - id: c\n    pool: p\n    proxy_token: file:tok\n    credentials:\n"
        f"      - name: gh\n        value: file:s\n        placeholder: {ph}\n"
        "        placeholder_template: github_classic\n        hosts: [api.github.com]\n"
    )
    headers = [("Authorization", f"token {ph}")]
    e = explain(load_rules(rules), "c", "GET", "https://api.github.com/user", headers)
    text = render(e)
    assert "credential gh: swapped in header Authorization" in text
    assert "credential gh: its placeholder is of template github_classic (ghp_ + 36 of [A-Za-z0-9])" in text
    assert "CANARYexplain" not in text
