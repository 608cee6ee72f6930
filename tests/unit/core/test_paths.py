"""The canonical request identity (proxy/core/paths.py): one normalised path for every matcher, and
redaction of placeholders from audited targets (issue 13, classes 1 and 7)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import placeholders
from proxy.core.decide import Reason, check_path, decide_request
from proxy.core.errors import RulesError
from proxy.core.hooks import HookRoute, find
from proxy.core.hosts import HostPattern
from proxy.core.oauth import OAuthSpec, parse_spec
from proxy.core.paths import REDACTED, canonical_path, prefix_problem, redact
from proxy.core.policy import EgressRule, Pool
from proxy.rules.loader import load_rules

HOST = "auth.test"


def _rule(i: int, paths: list[str]) -> EgressRule:
    return EgressRule(
        f"p.egress[{i}]", HostPattern.parse(HOST), frozenset({443}), frozenset(), tuple(paths), True
    )


ROUTES = (
    HookRoute("p.hooks[0]", HostPattern.parse(HOST), frozenset({"POST"}), ("/hook/ok",), ("x",)),
    HookRoute("p.hooks[1]", HostPattern.parse(HOST), frozenset(), ("/v1/admin/",), ("x",)),
)
POOL = Pool("p", (_rule(0, ["/oauth", "/v1/", "/hook", "/a/b"]),), hooks=ROUTES)
REPORT = dataclasses.replace(POOL, report=True)
SPEC = OAuthSpec(HOST, "/oauth/token")


def _answers(target: str) -> tuple[bool, object, bool]:
    """What every path matcher says about ``target``: egress allows it (and report mode agrees:
    it would deny exactly what egress denies), which hook route takes it, whether it is the
    token endpoint."""
    ident = canonical_path(target)
    allowed = decide_request(POOL, HOST, 443, "POST", ident).allowed
    reported = decide_request(REPORT, HOST, 443, "POST", ident)
    assert reported.allowed and (reported.would_deny is None) == allowed
    return allowed, find(POOL.hooks, HOST, "POST", ident), SPEC.matches(HOST, ident)


def _refused(target: str) -> bool:
    return check_path(POOL, HOST, canonical_path(target), [HOST]) is not None


# --- the canonical form ------------------------------------------------------------------------

CANONICAL = [
    ("/token", "/token", "plain"),
    ("/%74oken", "/token", "encoded-letter"),
    ("/%74%6F%6b%65%6E", "/token", "mixed-case-escapes"),
    ("/a%2Db%5f%7E%2e", "/a-b_~.", "encoded-unreserved-marks"),
    ("/token/", "/token", "trailing-slash"),
    ("/a//b", "/a/b", "doubled-slash"),
    ("/a;x=1/b;y", "/a/b", "matrix-params"),
    ("/a%3ab", "/a%3Ab", "reserved-escape-upper-cased"),
    ("/caf\u00e9", "/caf%C3%A9", "raw-non-ascii-encoded"),
    ("/a?x=1&y=/../b", "/a", "query-not-part"),
    ("", "/", "empty-is-root"),
    ("/", "/", "root"),
]


@pytest.mark.parametrize(("target", "canonical"), [r[:2] for r in CANONICAL], ids=[r[2] for r in CANONICAL])
def test_canonical_form(target: str, canonical: str) -> None:
    ident = canonical_path(target)
    assert ident.ambiguity is None
    assert ident.canonical == canonical
    assert ident.target == target


AMBIGUOUS = [
    ("/a%2Fb", "encoded slash", "encoded-slash"),
    ("/a%2fb", "encoded slash", "encoded-slash-lower"),
    ("/a%5Cb", "encoded backslash", "encoded-backslash"),
    ("/a\\b", "backslash", "raw-backslash"),
    ("/a/../b", "dot segment", "dot-dot"),
    ("/a/./b", "dot segment", "dot"),
    ("/a/%2e%2E/b", "dot segment", "encoded-dot-dot"),
    ("/a/.%2e/b", "dot segment", "half-encoded-dot-dot"),
    ("/a/..;x/b", "dot segment", "dot-dot-with-param"),
    ("/a/.%20/b", "dot segment", "dot-and-space"),
    ("/a/...", "dot segment", "three-dots"),
    ("/a/%252e%252e/b", "encoded percent", "double-encoding"),
    ("/a/..%3Bx/b", "encoded semicolon", "encoded-semicolon"),
    ("/a/b%00", "control character", "encoded-nul"),
    ("/a/b\x00", "control character", "raw-nul"),
    ("/a/b%0a", "control character", "encoded-newline"),
    ("/a/%u002e", "two-hex-digit", "iis-u-escape"),
    ("/a/%g0", "two-hex-digit", "bad-hex"),
    ("/a/b%2", "two-hex-digit", "truncated-escape"),
    ("/a/%C0%AE", "UTF-8", "overlong-utf8"),
    ("/a/%FF", "UTF-8", "invalid-utf8"),
    ("*", "not an absolute path", "asterisk-form"),
    ("/oauth/token%3Fx", "encoded question mark", "encoded-question-mark"),
    ("/oauth/token%3f", "encoded question mark", "encoded-question-mark-lower"),
    ("/hook/ok%23x", "encoded number sign", "encoded-number-sign"),
    ("/a#/../b", "'#'", "fragment-hiding-a-dot-segment"),
    ("/a#", "'#'", "empty-fragment"),
    ("/a/b#x", "'#'", "fragment"),
    ("/a?x=1#f", "'#'", "fragment-after-query"),
]


@pytest.mark.parametrize(("target", "why"), [r[:2] for r in AMBIGUOUS], ids=[r[2] for r in AMBIGUOUS])
def test_ambiguous_spellings_are_named_and_refused_where_paths_matter(target: str, why: str) -> None:
    ident = canonical_path(target)
    assert ident.ambiguity is not None and why in ident.ambiguity
    refusal = check_path(POOL, HOST, ident, ())
    assert refusal is not None
    assert (refusal.reason, refusal.status) == (Reason.AMBIGUOUS_PATH, 400)
    assert target not in refusal.message
    # an allow-list never takes it under a real prefix; a catch matcher always does
    assert not ident.within("/oauth") and ident.reaches("/hook/ok") and ident.names("/oauth/token")


def test_report_mode_never_relaxes_an_ambiguous_path() -> None:
    refusal = check_path(REPORT, HOST, canonical_path("/oauth/%2e%2e/admin"), ())
    assert refusal is not None and not refusal.allowed and refusal.would_deny is None


def test_an_ambiguous_path_passes_where_nothing_matches_on_paths() -> None:
    """Only '/' rules, no hooks, no token endpoint on the host: the path decides nothing."""
    open_pool = Pool("p", (_rule(0, ["/"]),))
    ident = canonical_path("/a%2Fb/../c")
    assert check_path(open_pool, HOST, ident, ()) is None
    assert decide_request(open_pool, HOST, 443, "GET", ident).allowed
    # the same host with a token endpoint of the claim on it: refused
    assert check_path(open_pool, HOST, ident, [HOST]) is not None
    assert check_path(open_pool, HOST, ident, ["other.test"]) is None


# --- the examples of issue 13 ------------------------------------------------------------------


def test_post_percent_74oken_is_the_token_endpoint() -> None:
    """POST /%74oken used to miss capture, and the sandbox got the real tokens."""
    spec = OAuthSpec(HOST, "/token")
    for target in ["/%74oken", "/%74OKEN", "/token/", "/token;x", "//token", "/TOKEN", "/token?grant=1"]:
        assert spec.matches(HOST, target), target
    assert not spec.matches(HOST, "/tokens") and not spec.matches(HOST, "/token/x")
    assert not spec.matches("other.test", "/%74oken")


def test_the_same_spelling_on_a_hook_route_path_is_the_route() -> None:
    for target in ["/hook/%6Fk", "/%68ook/ok", "/hook/ok/", "/hook//ok", "/hook/ok;p", "/HOOK/Ok"]:
        assert find(ROUTES, HOST, "POST", target) is ROUTES[0], target
    assert find(ROUTES, HOST, "POST", "/hook/okx") is None


# --- every matcher, every spelling --------------------------------------------------------------

_WORDS = ["oauth", "token", "hook", "ok", "v1", "admin", "a", "b", "x.y", "a-b", "z~"]
_canonical_paths = st.lists(st.sampled_from(_WORDS), max_size=4).map(lambda s: "/" + "/".join(s))


def _hex(data: st.DataObject, c: str) -> str:
    h = f"{ord(c):02X}"
    return "%" + "".join(data.draw(st.sampled_from([x.lower(), x])) for x in h)


@st.composite
def _spelling(draw: st.DrawFn, canonical: str) -> tuple[str, bool]:
    """A spelling of ``canonical`` and whether it keeps every reading the same (only escapes of
    unreserved characters, in either hex case, and a trailing slash)."""
    data = draw(st.data())
    segments = canonical.split("/")[1:] if canonical != "/" else []
    out, exact = [], True
    for seg in segments:
        spelled = "".join(_hex(data, c) if draw(st.booleans()) else c for c in seg)
        if draw(st.integers(0, 5)) == 0:
            spelled += ";" + draw(st.sampled_from(["p", "jsessionid=1", "v=2;w"]))
            exact = False
        out.append(spelled)
        if draw(st.integers(0, 5)) == 0:
            out.append("")  # a doubled slash
            exact = False
    path = "/" + "/".join(out)
    if draw(st.booleans()) and not path.endswith("/"):
        path += "/"
    return path + draw(st.sampled_from(["", "?x=1", "?surr_AAAAAAAAAAAAAAAA"])), exact


@settings(max_examples=200)
@given(_canonical_paths, st.data())
def test_every_spelling_gets_the_answers_of_its_canonical_path(canonical: str, data: st.DataObject) -> None:
    spelled, exact = data.draw(_spelling(canonical))
    assert not _refused(spelled)
    allowed, hook, endpoint = _answers(spelled)
    want_allowed, want_hook, want_endpoint = _answers(canonical)
    # catch matchers (hooks, token endpoints) take every spelling of what they take
    assert (hook, endpoint) == (want_hook, want_endpoint)
    # an allow-list never allows more for a spelling; with one reading, exactly the same
    assert not allowed or want_allowed
    if exact:
        assert allowed == want_allowed


_POISON = [
    "%2F",
    "%2f",
    "%5C",
    "\\",
    "/../",
    "/./",
    "/%2e%2e/",
    "/.%2E/",
    "%00",
    "%25",
    "%u0041",
    "%C0%AE",
    "%G1",
]


@settings(max_examples=200)
@given(_canonical_paths, st.data(), st.sampled_from(_POISON))
def test_every_ambiguous_spelling_is_refused(canonical: str, data: st.DataObject, poison: str) -> None:
    spelled, _ = data.draw(_spelling(canonical))
    path, sep, query = spelled.partition("?")
    at = data.draw(st.integers(1, len(path)))
    assert _refused(path[:at] + poison + path[at:] + sep + query)


@given(st.sampled_from(_WORDS), st.sampled_from(_WORDS))
def test_case_is_folded_only_by_catch_matchers(a: str, b: str) -> None:
    upper = f"/{a}/{b}".upper()
    allowed, hook, endpoint = _answers(upper)
    _, want_hook, want_endpoint = _answers(f"/{a}/{b}")
    assert (hook, endpoint) == (want_hook, want_endpoint)
    assert not allowed  # every rule prefix is lower case: RFC 3986 §6.2.2.1, paths are case-sensitive


# --- configured prefixes and endpoints ----------------------------------------------------------

PREFIXES = [
    ("/repos", None, "plain"),
    ("/repos/", None, "trailing-slash"),
    ("/%72epos", None, "encoded-letter"),
    ("repos", "must start with '/'", "relative"),
    ("/repos?x", "no query", "query"),
    ("/a/../b", "ambiguous", "dot-dot"),
    ("/a%2Fb", "ambiguous", "encoded-slash"),
    ("/a//b", "'//' or ';'", "doubled-slash"),
    ("/a;x", "'//' or ';'", "param"),
]


@pytest.mark.parametrize(("prefix", "problem"), [r[:2] for r in PREFIXES], ids=[r[2] for r in PREFIXES])
def test_a_configured_prefix_has_one_reading(prefix: str, problem: str | None) -> None:
    got = prefix_problem(prefix)
    assert got is None if problem is None else (got is not None and problem in got)


def test_rules_check_refuses_an_ambiguous_prefix(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        textwrap.dedent("""\
            version: 1
            pools:
              p:
                egress:
                  - host: api.test
                    paths: ["/repos/%2e%2e/admin"]
            """)
    )
    with pytest.raises(RulesError) as e:
        load_rules(rules)
    assert "egress[0].paths[0]" in str(e.value) and "ambiguous" in str(e.value)


def test_a_token_endpoint_declaration_must_have_one_reading() -> None:
    doc = {"token_endpoint": {"host": HOST, "path": "/oauth/%2e%2e/token"}}
    with pytest.raises(ValueError, match="ambiguous"):
        parse_spec(doc)
    assert parse_spec({"token_endpoint": {"host": HOST, "path": "/oauth/token"}}).path == "/oauth/token"


# --- redaction (class 7) ------------------------------------------------------------------------

PH = "surr_AuditPlaceholder00001"
REDACT = [
    (f"/a?{PH}", f"/a?{REDACTED}", "bare-query-key"),
    (f"/a?{PH}=1", f"/a?{REDACTED}={REDACTED}", "query-key-with-value"),
    (f"/a?k={PH}", f"/a?k={REDACTED}", "query-value"),
    ("/a?x=1&y&z=2", f"/a?x={REDACTED}&y&z={REDACTED}", "plain-keys-kept"),
    (f"/a?{PH.replace('_', '%5F')}", f"/a?{REDACTED}", "percent-encoded-key"),
    (f"/a?{PH.replace('_', '%255f')}=1", f"/a?{REDACTED}={REDACTED}", "double-encoded-key"),
    (f"/a/{PH}/b", f"/a/{REDACTED}/b", "path-segment"),
    (f"/a/x;k={PH};v=1", f"/a/x;k={REDACTED};v=1", "matrix-param-value"),
    (f"/a/x;{PH}", f"/a/x;{REDACTED}", "matrix-param-name"),
    (f"/a#{PH}", f"/a#{REDACTED}", "fragment"),
    (f"/a?x=1#{PH}", f"/a?x={REDACTED}#{REDACTED}", "query-and-fragment"),
    ("/plain/path", "/plain/path", "nothing-to-redact"),
]


@pytest.mark.parametrize(("target", "logged"), [r[:2] for r in REDACT], ids=[r[2] for r in REDACT])
def test_redact(target: str, logged: str) -> None:
    assert redact(target) == logged


def _decodings(text: str) -> list[str]:
    out = [text]
    for _ in range(4):
        out.append(unquote(out[-1]))
    return out


def _spell_placeholder(data: st.DataObject) -> str:
    out = []
    for c in PH:
        how = data.draw(st.sampled_from(["raw", "raw", "hex", "HEX", "double"]))
        h = f"{ord(c):02x}"
        out.append({"raw": c, "hex": f"%{h}", "HEX": f"%{h.upper()}", "double": f"%25{h}"}[how])
    return "".join(out)


_part = st.sampled_from(["a", "v1", "x.y", "k", "", "1"])


@settings(max_examples=100)
@given(st.data(), st.lists(_part, min_size=1, max_size=4), st.lists(st.tuples(_part, _part), max_size=4))
def test_no_placeholder_survives_redaction_in_any_component(
    data: st.DataObject, segments: list[str], query: list[tuple[str, str]]
) -> None:
    segs = [
        data.draw(st.sampled_from([s, _spell_placeholder(data), f"{s};p={_spell_placeholder(data)}"]))
        for s in segments
    ]
    items = []
    for k, v in query:
        k = data.draw(st.sampled_from([k, _spell_placeholder(data), f"{k}.{_spell_placeholder(data)}"]))
        v = data.draw(st.sampled_from([v, _spell_placeholder(data)]))
        items.append(data.draw(st.sampled_from([f"{k}={v}", k])))
    target = "/" + "/".join(segs) + ("?" + "&".join(items) if items else "")
    logged = redact(target)
    for text in _decodings(logged):
        assert not placeholders.find(text.encode()), (target, logged)
    # a segment that held none is kept
    assert logged.split("?", 1)[0].split("/")[1:] == [
        s if not placeholders.find(unquote(unquote(unquote(s))).encode()) else _redacted_segment(s)
        for s in segs
    ]


def _redacted_segment(seg: str) -> str:
    name, sep, param = seg.partition(";p=")
    return (REDACTED if placeholders.find(unquote(unquote(unquote(name))).encode()) else name) + (
        f"{sep}{REDACTED}" if sep else ""
    )


def test_a_refusal_naming_the_path_never_quotes_a_placeholder() -> None:
    d = decide_request(POOL, HOST, 443, "GET", f"/nope/{PH}/x?{PH}=1")
    assert d.reason is Reason.PATH_NOT_ALLOWED
    assert PH not in json.dumps(d.message) and f"/nope/{REDACTED}/x" in d.message
