"""An egress rule's ``scheme`` (issue 13, class 3): ``https`` rules open tunnels and allow
``https://`` requests, ``http`` rules allow plain ``http://`` requests only. One row per case."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proxy.core.decide import Reason, decide_connect, decide_request
from proxy.core.errors import RulesError
from proxy.core.hosts import HostPattern
from proxy.core.policy import EgressRule, Pool
from proxy.rules.loader import load_rules


def rule(i: int, host: str, ports: tuple[int, ...], scheme: str, intercept: bool = True) -> EgressRule:
    return EgressRule(
        f"s.egress[{i}]",
        HostPattern.parse(host),
        frozenset(ports),
        frozenset(),
        ("/",),
        intercept,
        scheme=scheme,
    )


POOL = Pool(
    "s",
    (
        rule(0, "web.test", (80,), "http"),
        rule(1, "web.test", (443,), "https"),
        rule(2, "plain.test", (), "http"),  # any port, cleartext only
        rule(3, "tls.test", (443, 8443), "https"),
        rule(4, "tunnel.test", (22,), "https", intercept=False),
    ),
)

CONNECT = [
    ("web.test", 443, Reason.ALLOWED, "s.egress[1]", "connect-to-https-port"),
    ("web.test", 80, Reason.SCHEME_NOT_ALLOWED, None, "connect-to-a-port-allowed-for-plain-http"),
    ("plain.test", 443, Reason.SCHEME_NOT_ALLOWED, None, "connect-to-an-http-only-host-any-port"),
    ("tls.test", 8443, Reason.ALLOWED, "s.egress[3]", "connect-second-https-port"),
    ("tunnel.test", 22, Reason.ALLOWED, "s.egress[4]", "opaque-tunnel-is-https-scheme"),
    ("tls.test", 80, Reason.PORT_NOT_ALLOWED, None, "connect-port-no-rule-has"),
]


@pytest.mark.parametrize(
    ("host", "port", "reason", "rule_id"), [r[:4] for r in CONNECT], ids=[r[4] for r in CONNECT]
)
def test_only_https_rules_open_tunnels(host: str, port: int, reason: Reason, rule_id: str | None) -> None:
    d = decide_connect(POOL, host, port)
    assert (d.reason, d.rule.id if d.rule else None) == (reason, rule_id)
    assert d.allowed is (reason is Reason.ALLOWED)
    if reason is Reason.SCHEME_NOT_ALLOWED:
        assert d.status == 403 and "a tunnel (scheme: https)" in d.message


REQUEST = [
    ("http", "web.test", 80, Reason.ALLOWED, "s.egress[0]", "http-to-http-port"),
    ("https", "web.test", 443, Reason.ALLOWED, "s.egress[1]", "https-to-https-port"),
    ("http", "web.test", 443, Reason.SCHEME_NOT_ALLOWED, None, "http-toward-a-tls-port"),
    ("https", "web.test", 80, Reason.SCHEME_NOT_ALLOWED, None, "https-toward-an-http-port"),
    ("http", "tls.test", 8443, Reason.SCHEME_NOT_ALLOWED, None, "http-toward-a-tls-only-host"),
    ("http", "plain.test", 8443, Reason.ALLOWED, "s.egress[2]", "http-rule-any-port"),
    ("https", "plain.test", 443, Reason.SCHEME_NOT_ALLOWED, None, "https-toward-an-http-only-host"),
    ("http", "tls.test", 80, Reason.PORT_NOT_ALLOWED, None, "port-checked-before-scheme"),
]


@pytest.mark.parametrize(
    ("scheme", "host", "port", "reason", "rule_id"), [r[:5] for r in REQUEST], ids=[r[5] for r in REQUEST]
)
def test_a_request_is_allowed_only_by_a_rule_of_its_scheme(
    scheme: str, host: str, port: int, reason: Reason, rule_id: str | None
) -> None:
    d = decide_request(POOL, host, port, "GET", "/", scheme=scheme)
    assert (d.reason, d.rule.id if d.rule else None) == (reason, rule_id)
    if reason is Reason.SCHEME_NOT_ALLOWED:
        assert f"allows {scheme}:// to {host}:{port}" in d.message


def test_an_opaque_rule_never_allows_a_request_inside_an_intercepted_tunnel_whatever_its_scheme() -> None:
    d = decide_request(POOL, "tunnel.test", 22, "GET", "/", intercepted_only=True, scheme="https")
    assert d.reason is Reason.NO_RULE


def _load(tmp_path: Path, egress: str) -> object:
    path = tmp_path / "rules.yaml"
    path.write_text("version: 1\npools:\n  p:\n    egress:\n" + textwrap.indent(egress, "      "))
    return load_rules(path)


def test_scheme_defaults_to_https_and_is_read(tmp_path: Path) -> None:
    policy = _load(tmp_path, "- host: a.test\n- host: a.test\n  ports: [80]\n  scheme: http\n")
    assert [r.scheme for r in policy.pools["p"].egress] == ["https", "http"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("egress", "field", "words"),
    [
        ("- host: a.test\n  scheme: ftp\n", "pools.p.egress[0].scheme", "https"),
        ("- host: a.test\n  scheme: HTTP\n", "pools.p.egress[0].scheme", "https"),
        (
            "- host: a.test\n  scheme: http\n  intercept: false\n",
            "pools.p.egress[0].scheme",
            "cannot be intercept: false",
        ),
    ],
    ids=["unknown-scheme", "upper-case-scheme", "http-opaque"],
)
def test_a_bad_scheme_is_a_rules_error_at_its_field(
    tmp_path: Path, egress: str, field: str, words: str
) -> None:
    with pytest.raises(RulesError) as e:
        _load(tmp_path, egress)
    (problem,) = e.value.problems
    assert problem.field == field and words in problem.message


def test_port_80_under_scheme_https_is_a_warning(tmp_path: Path) -> None:
    policy = _load(tmp_path, "- host: a.test\n  ports: [80, 443]\n")
    (warning,) = policy.warnings  # type: ignore[attr-defined]
    assert warning.field == "pools.p.egress[0].ports" and "scheme: http" in warning.message


def test_an_http_rule_does_not_cover_a_credential_host(tmp_path: Path) -> None:
    (tmp_path / "v").write_text("x")
    path = tmp_path / "rules.yaml"
    path.write_text(
        textwrap.dedent("""\
        version: 1
        pools:
          p:
            egress:
              - host: a.test
                ports: [80]
                scheme: http
        claims:
          - id: c
            pool: p
            proxy_token: file:v
            credentials:
              - name: k
                value: file:v
                placeholder: surr_SchemeRulesPlaceholder01
                hosts: [a.test]
        """)
    )
    with pytest.raises(RulesError) as e:
        load_rules(path)
    assert any("not covered by an intercepting egress rule" in p.message for p in e.value.problems)
