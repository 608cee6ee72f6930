"""proxy.core.decide: explained, default-deny decisions for CONNECTs and requests over one pool."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.decide import Action, Decision, Reason, decide_connect, decide_request, deny, path_matches
from proxy.core.hosts import HostPattern
from proxy.core.policy import EgressRule, Pool


def rule(
    i: int,
    host: str,
    ports: Iterable[int] = (),
    methods: Iterable[str] = (),
    paths: Iterable[str] = ("/",),
    intercept: bool = True,
    pool: str = "t",
) -> EgressRule:
    return EgressRule(
        f"{pool}.egress[{i}]",
        HostPattern.parse(host),
        frozenset(ports),
        frozenset(methods),
        tuple(paths),
        intercept,
    )


POOL = Pool(
    "t",
    (
        rule(0, "api.github.com", ports=[443], methods=["GET", "POST"], paths=["/repos", "/user/"]),
        rule(1, "*.example.com", ports=[443, 8443]),
        rule(2, "anyport.test"),  # no ports, no methods: any
        rule(3, "pypi.org", intercept=False),
    ),
)

# --- decide_connect -------------------------------------------------------------------------

CONNECT = [
    ("api.github.com", 443, Reason.ALLOWED, "t.egress[0]", "allowed-exact-host"),
    ("a.example.com", 8443, Reason.ALLOWED, "t.egress[1]", "allowed-wildcard-host-second-port"),
    ("a.b.example.com", 443, Reason.ALLOWED, "t.egress[1]", "allowed-wildcard-deeper-host"),
    ("anyport.test", 22, Reason.ALLOWED, "t.egress[2]", "allowed-empty-ports-means-any"),
    ("pypi.org", 443, Reason.ALLOWED, "t.egress[3]", "allowed-non-intercepting-rule"),
    ("evil.example.net", 443, Reason.NO_RULE, None, "no-rule-unknown-host"),
    ("example.com", 443, Reason.NO_RULE, None, "no-rule-wildcard-not-apex"),
    ("badexample.com", 443, Reason.NO_RULE, None, "no-rule-wildcard-label-boundary"),
    ("api.github.com", 80, Reason.PORT_NOT_ALLOWED, None, "port-not-allowed"),
    ("a.example.com", 80, Reason.PORT_NOT_ALLOWED, None, "port-not-allowed-wildcard"),
]


@pytest.mark.parametrize(
    ("host", "port", "reason", "rule_id"), [r[:4] for r in CONNECT], ids=[r[4] for r in CONNECT]
)
def test_decide_connect_decides_on_host_and_port(
    host: str, port: int, reason: Reason, rule_id: str | None
) -> None:
    d = decide_connect(POOL, host, port)
    assert d.reason is reason
    assert d.allowed is (reason is Reason.ALLOWED)
    assert d.action is (Action.ALLOW if d.allowed else Action.DENY)
    assert d.status == (200 if d.allowed else 403)
    assert (d.rule.id if d.rule else None) == rule_id


def test_decide_connect_ignores_method_and_path_restrictions() -> None:
    pool = Pool("t", (rule(0, "api.github.com", ports=[443], methods=["GET"], paths=["/only"]),))
    assert decide_connect(pool, "api.github.com", 443).allowed


def test_decide_connect_empty_pool_is_default_deny() -> None:
    d = decide_connect(Pool("empty", ()), "api.github.com", 443)
    assert (d.action, d.reason, d.rule) == (Action.DENY, Reason.NO_RULE, None)


# --- decide_request -------------------------------------------------------------------------

REQUEST = [
    ("api.github.com", 443, "GET", "/repos", Reason.ALLOWED, "allowed-prefix-exact"),
    ("api.github.com", 443, "POST", "/repos/o/r/issues", Reason.ALLOWED, "allowed-below-prefix"),
    ("api.github.com", 443, "GET", "/repos?per_page=1", Reason.ALLOWED, "allowed-query-ignored"),
    ("api.github.com", 443, "GET", "/user/keys", Reason.ALLOWED, "allowed-trailing-slash-prefix"),
    ("a.example.com", 443, "DELETE", "/anything", Reason.ALLOWED, "allowed-empty-methods-means-any"),
    ("anyport.test", 8080, "GET", "/", Reason.ALLOWED, "allowed-empty-ports-means-any"),
    ("a.example.com", 443, "GET", "", Reason.ALLOWED, "empty-path-is-root"),
    ("a.example.com", 443, "GET", "?q=1", Reason.ALLOWED, "query-only-path-is-root"),
    ("evil.example.net", 443, "GET", "/", Reason.NO_RULE, "no-rule"),
    ("example.com", 443, "GET", "/", Reason.NO_RULE, "no-rule-wildcard-not-apex"),
    ("api.github.com", 80, "GET", "/repos", Reason.PORT_NOT_ALLOWED, "port-not-allowed"),
    ("api.github.com", 443, "DELETE", "/repos", Reason.METHOD_NOT_ALLOWED, "method-not-allowed"),
    ("api.github.com", 443, "get", "/repos", Reason.METHOD_NOT_ALLOWED, "method-case-sensitive"),
    ("api.github.com", 443, "GET", "/reposx", Reason.PATH_NOT_ALLOWED, "path-segment-aware"),
    ("api.github.com", 443, "GET", "/admin", Reason.PATH_NOT_ALLOWED, "path-not-allowed"),
    ("api.github.com", 443, "GET", "/user", Reason.PATH_NOT_ALLOWED, "path-without-slash-of-prefix"),
    ("api.github.com", 443, "GET", "/admin?next=/repos", Reason.PATH_NOT_ALLOWED, "query-not-path"),
]


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "reason"),
    [r[:5] for r in REQUEST],
    ids=[r[5] for r in REQUEST],
)
def test_decide_request_gives_one_reason_per_failure(
    host: str, port: int, method: str, path: str, reason: Reason
) -> None:
    d = decide_request(POOL, host, port, method, path)
    assert d.reason is reason
    assert d.allowed is (reason is Reason.ALLOWED)
    assert d.status == (200 if d.allowed else 403)
    if d.allowed:
        assert d.rule is not None and d.rule.label() in d.message
    else:
        assert d.action is Action.DENY and d.rule is None
        assert "'t'" in d.message and host in d.message


REFUSAL_MESSAGES = [
    ("evil.example.net", 443, "GET", "/", "allows host evil.example.net", "no-rule-names-host"),
    ("api.github.com", 80, "GET", "/repos", "allows port 80 on api.github.com", "port-names-port"),
    ("api.github.com", 443, "PUT", "/repos", "allows PUT to api.github.com", "method-names-method"),
    ("api.github.com", 443, "GET", "/x?secret=1", "allows path /x on", "path-names-path-no-query"),
]


@pytest.mark.parametrize(
    ("host", "port", "method", "path", "fragment"),
    [r[:5] for r in REFUSAL_MESSAGES],
    ids=[r[5] for r in REFUSAL_MESSAGES],
)
def test_decide_request_refusal_sentence_names_what_failed(
    host: str, port: int, method: str, path: str, fragment: str
) -> None:
    d = decide_request(POOL, host, port, method, path)
    assert fragment in d.message
    assert "secret=1" not in d.message


def test_decide_request_first_matching_rule_wins() -> None:
    pool = Pool(
        "t",
        (
            rule(0, "*.example.com", methods=["GET"]),
            rule(1, "a.example.com", paths=["/x"]),
            rule(2, "a.example.com"),
        ),
    )
    assert decide_request(pool, "a.example.com", 443, "GET", "/x").rule == pool.egress[0]
    assert decide_request(pool, "a.example.com", 443, "POST", "/x").rule == pool.egress[1]
    assert decide_request(pool, "a.example.com", 443, "POST", "/y").rule == pool.egress[2]


def test_decide_connect_first_matching_rule_wins() -> None:
    pool = Pool("t", (rule(0, "*", ports=[443]), rule(1, "api.github.com", ports=[443])))
    assert decide_connect(pool, "api.github.com", 443).rule == pool.egress[0]


def test_decide_request_refusal_names_the_reason_of_the_rule_that_got_furthest() -> None:
    pool = Pool(
        "t",
        (
            rule(0, "a.example.com", ports=[8443]),  # fails on port
            rule(1, "a.example.com", methods=["POST"], paths=["/x"]),  # fails on method
            rule(2, "b.example.com", paths=["/y"]),  # other host: not considered
        ),
    )
    assert decide_request(pool, "a.example.com", 443, "GET", "/x").reason is Reason.METHOD_NOT_ALLOWED
    pool_rev = Pool("t", tuple(reversed(pool.egress)))
    assert decide_request(pool_rev, "a.example.com", 443, "GET", "/x").reason is Reason.METHOD_NOT_ALLOWED


AMBIGUOUS_PATHS = [
    ("/repos/../admin", "dot-dot-segment"),
    ("/repos/%2e%2e/admin", "encoded-dot-dot"),
    ("/repos/.%2E/admin", "mixed-encoded-dot-dot"),
    ("/repos/./x", "dot-segment"),
    ("/repos/x/..", "trailing-dot-dot"),
    ("/repos%2f..%2fadmin", "encoded-slash"),
    ("/repos\\..\\admin", "backslash"),
    ("/repos/%5c", "encoded-backslash"),
]


@pytest.mark.parametrize("path", [r[0] for r in AMBIGUOUS_PATHS], ids=[r[1] for r in AMBIGUOUS_PATHS])
def test_decide_request_path_an_upstream_could_read_as_another_path_is_refused(path: str) -> None:
    # Upstream servers resolve dot-segments (RFC 3986 §5.2.4): /repos/../admin reaches /admin.
    pool = Pool("t", (rule(0, "api.github.com", paths=["/repos"]),))
    d = decide_request(pool, "api.github.com", 443, "GET", path)
    assert d.reason is Reason.PATH_NOT_ALLOWED


@pytest.mark.parametrize(
    "path", ["/repos/..;/admin", "/repos/..;x=1/admin"], ids=["dot-dot-semicolon", "dot-dot-param"]
)
def test_decide_request_dot_dot_with_path_parameter_is_refused(path: str) -> None:
    pool = Pool("t", (rule(0, "api.github.com", paths=["/repos"]),))
    assert decide_request(pool, "api.github.com", 443, "GET", path).reason is Reason.PATH_NOT_ALLOWED


def test_decide_request_root_prefix_allows_any_path_even_with_dot_segments() -> None:
    # Under "/" every path an upstream could resolve to is already allowed.
    pool = Pool("t", (rule(0, "api.github.com"),))
    assert decide_request(pool, "api.github.com", 443, "GET", "/a/../b").allowed


# --- path_matches ---------------------------------------------------------------------------

PATHS = [
    ("/repos", "/repos", True, "equal"),
    ("/repos", "/repos/x", True, "below"),
    ("/repos", "/repos/", True, "trailing-slash"),
    ("/repos", "/reposx", False, "not-at-segment-boundary"),
    ("/repos", "/repo", False, "shorter"),
    ("/repos", "/", False, "root"),
    ("/repos/", "/repos/x", True, "slash-prefix-below"),
    ("/repos/", "/repos", False, "slash-prefix-needs-slash"),
    ("/", "/", True, "root-prefix-root"),
    ("/", "/anything/at/all", True, "root-prefix-anything"),
    ("/a/b", "/a/b/c", True, "multi-segment"),
    ("/a/b", "/a/bc", False, "multi-segment-boundary"),
    ("/repos", "/repos/../admin", False, "dot-dot-under-prefix"),
    ("/repos/", "/repos/%2E%2E/admin", False, "encoded-dot-dot-under-slash-prefix"),
    ("/", "/repos/../admin", True, "root-prefix-dot-dot"),
]


@pytest.mark.parametrize(("prefix", "path", "expected"), [r[:3] for r in PATHS], ids=[r[3] for r in PATHS])
def test_path_matches_is_segment_aware(prefix: str, path: str, expected: bool) -> None:
    assert path_matches(prefix, path) is expected


_path = st.lists(st.sampled_from(["a", "b", "ab", "", ".", ".."]), min_size=1, max_size=4).map(
    lambda segs: "/" + "/".join(segs)
)


@given(_path, _path)
def test_path_matches_agrees_with_segment_oracle(prefix: str, path: str) -> None:
    """Every reading of the path (repeated slashes merged or kept; one trailing slash never
    counts) must be inside the prefix; a prefix ending in '/' covers only what is strictly below
    it; a prefix with dot segments or '//' is invalid (rules check refuses it) and allows nothing."""

    def segs(p: str, merge: bool) -> list[str]:
        s = p.split("/")[1:]
        if s and s[-1] == "":
            s = s[:-1]
        return [x for x in s if x] if merge else s

    prefix_segs = prefix.split("/")[1:]
    if prefix == "/":
        expected = True
    elif "." in prefix_segs or ".." in prefix_segs or "" in prefix_segs[:-1]:
        expected = False  # not a valid prefix
    elif "." in path.split("/") or ".." in path.split("/"):
        expected = False  # an upstream could resolve it outside the prefix
    else:
        want, strict = segs(prefix, True), prefix.endswith("/")
        expected = all(
            r[: len(want)] == want and (len(r) > len(want) or not strict)
            for r in (segs(path, True), segs(path, False))
        )
    assert path_matches(prefix, path) is expected


# --- deny -----------------------------------------------------------------------------------

DENY = [
    (Reason.NO_RULE, Action.DENY, "no-rule-is-deny"),
    (Reason.PROXY_AUTH_REQUIRED, Action.DENY, "proxy-auth-is-deny"),
    (Reason.AUTHORITY_MISMATCH, Action.DENY, "authority-mismatch-is-deny"),
    (Reason.PLACEHOLDER_VIOLATION, Action.VIOLATION, "placeholder-violation-is-violation"),
    (Reason.CLEARTEXT_CREDENTIAL, Action.VIOLATION, "cleartext-is-violation"),
    (Reason.CREDENTIAL_UNAVAILABLE, Action.ERROR, "credential-unavailable-is-error"),
    (Reason.UPSTREAM_ERROR, Action.ERROR, "upstream-error-is-error"),
]


@pytest.mark.parametrize(("reason", "action"), [r[:2] for r in DENY], ids=[r[2] for r in DENY])
def test_deny_maps_reason_to_action(reason: Reason, action: Action) -> None:
    d = deny(reason, "because", status=418)
    assert d == Decision(action, reason, "because", None, 418)
    assert not d.allowed


@pytest.mark.parametrize(
    "path",
    [
        "/repos/..%3b/admin",
        "/repos/%252e%252e/admin",
        "/repos/%c0%ae%c0%ae/admin",
        "/repos/%u002e%u002e/admin",
        "/repos/..%3Bx=1/admin",
    ],
    ids=[
        "encoded-semicolon",
        "double-encoded-dots",
        "overlong-utf8-dots",
        "iis-u-escape",
        "encoded-semicolon-param",
    ],
)
def test_path_spellings_an_upstream_may_decode_differently_never_match_a_prefix(path: str) -> None:
    """Found by the adversarial review: each of these can reach /admin on some upstream."""
    assert not path_matches("/repos", path)


def _report_pool(pool_report: bool, rule_report: bool) -> Pool:
    rule = EgressRule(
        "p.egress[0]",
        HostPattern.parse("api.test"),
        frozenset({443}),
        frozenset({"GET"}),
        ("/v1",),
        True,
        rule_report,
    )
    return Pool("p", (rule,), report=pool_report)


@pytest.mark.parametrize(
    ("pool_report", "rule_report", "method", "host", "would"),
    [
        (True, False, "POST", "api.test", Reason.METHOD_NOT_ALLOWED),
        (True, False, "GET", "other.test", Reason.NO_RULE),
        (False, True, "POST", "api.test", Reason.METHOD_NOT_ALLOWED),
        (False, True, "GET", "other.test", None),  # the rule never matched the host: no report
        (False, False, "POST", "api.test", None),
    ],
    ids=["pool-method", "pool-no-rule", "rule-method", "rule-other-host-refused", "no-report"],
)
def test_report_mode_allows_and_says_what_it_would_deny(
    pool_report: bool, rule_report: bool, method: str, host: str, would: Reason | None
) -> None:
    d = decide_request(_report_pool(pool_report, rule_report), host, 443, method, "/v1/x")
    if would is None:
        assert not d.allowed and d.would_deny is None
    else:
        assert d.allowed and d.would_deny is would and d.message.startswith("report mode")


def test_report_mode_never_relaxes_an_allowed_request() -> None:
    d = decide_request(_report_pool(True, True), "api.test", 443, "GET", "/v1/x")
    assert d.allowed and d.would_deny is None


def test_a_rule_with_methods_must_list_every_method_a_server_may_read_the_request_as() -> None:
    pool = Pool("t", (rule(0, "a.example.com", methods=["GET", "HEAD"]),))
    assert decide_request(pool, "a.example.com", 443, "GET", "/x", also={"HEAD"}).allowed
    d = decide_request(pool, "a.example.com", 443, "GET", "/x", also={"DELETE"})
    assert not d.allowed and d.reason == Reason.METHOD_NOT_ALLOWED
    assert "GET (also read as DELETE)" in d.message
    d = decide_request(pool, "a.example.com", 443, "GET", "/x", also={"DEL\r\nX: 1"})
    assert "\r" not in d.message and "another method" in d.message  # the sandbox's value is not echoed
