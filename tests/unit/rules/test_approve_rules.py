"""An egress rule's ``approve:`` (issue 16): read into :class:`proxy.core.approvals.Ask`, each wrong
field reported at its place, and what it asks for (methods, path prefixes as a catch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.core.approvals import SCOPES, Ask, offered
from proxy.core.errors import RulesError
from proxy.rules.loader import load_rules


def _load(tmp_path: Path, approve: str, extra: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        f"version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n{extra}        approve: {approve}\n"
    )
    return path


def test_approve_is_read_with_its_defaults(tmp_path: Path) -> None:
    [rule] = load_rules(_load(tmp_path, "{}")).pools["p"].egress
    assert rule.approve == Ask(frozenset(), ("/",), 60.0, SCOPES)
    [rule] = (
        load_rules(_load(tmp_path, "{methods: [POST], paths: [/v1], timeout: 5, scopes: [once, for]}"))
        .pools["p"]
        .egress
    )
    assert rule.approve == Ask(frozenset({"POST"}), ("/v1",), 5.0, ("once", "for"))


def test_a_rule_without_approve_asks_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n")
    assert load_rules(path).pools["p"].egress[0].approve is None


@pytest.mark.parametrize(
    ("approve", "extra", "field", "said"),
    [
        ("{methods: [post]}", "", "pools.p.egress[0].approve.methods[0]", "upper-case token"),
        ("{paths: [v1]}", "", "pools.p.egress[0].approve.paths[0]", "path prefix"),
        ("{paths: ['/a/../b']}", "", "pools.p.egress[0].approve.paths[0]", "path prefix"),
        ("{timeout: 0}", "", "pools.p.egress[0].approve.timeout", "more than 0"),
        ("{timeout: 3601}", "", "pools.p.egress[0].approve.timeout", "at most 3600"),
        ("{timeout: -1}", "", "pools.p.egress[0].approve.timeout", "more than 0"),
        ("{scopes: []}", "", "pools.p.egress[0].approve.scopes", "non-empty"),
        ("{scopes: [forever]}", "", "pools.p.egress[0].approve.scopes", "unknown scope"),
        ("{scopes: [once, once]}", "", "pools.p.egress[0].approve.scopes", "twice"),
        ("{}", "        intercept: false\n", "pools.p.egress[0].approve", "intercept: true"),
        ("{ask: yes}", "", "pools.p.egress[0].approve.ask", ""),
        ("yes", "", "pools.p.egress[0].approve", ""),
    ],
)
def test_a_wrong_approve_field_is_reported_where_it_is(
    tmp_path: Path, approve: str, extra: str, field: str, said: str
) -> None:
    with pytest.raises(RulesError) as info:
        load_rules(_load(tmp_path, approve, extra))
    found = [p for p in info.value.problems if p.field == field]
    assert found, info.value.problems
    assert said in found[0].message
    assert found[0].line is not None


@pytest.mark.parametrize(
    ("method", "target", "asks"),
    [
        ("POST", "/v1", True),
        ("POST", "/v1/x?y=1", True),
        ("POST", "/V1/x", True),  # a catch: the upstream may route it to /v1
        ("POST", "/%761/x", True),  # an escaped spelling of /v1
        ("POST", "/v1;x", True),  # an ambiguous path asks
        ("POST", "/a/../v1/x", True),
        ("POST", "/v2", False),
        ("POST", "/v1x", False),
        ("GET", "/v1", False),
        ("post", "/v1", True),  # an upstream may upper-case it: asked (fail closed)
        ("Post", "/v1", True),
    ],
)
def test_what_an_ask_asks_for(method: str, target: str, asks: bool) -> None:
    assert Ask(frozenset({"POST"}), ("/v1",)).asks(method, target) is asks


def test_an_ask_without_methods_asks_for_every_method() -> None:
    assert all(Ask().asks(m, "/anything") for m in ("GET", "HEAD", "DELETE", "PATCH"))


@pytest.mark.parametrize(
    ("path", "grantable"),
    [
        ("/v1/x", True), ("/v1/x/", True), ("/v1/x?q=1", True), ("/", True),
        ("/v1/x/%2e%2e/y", False), ("/v1/x/../y", False), ("/v1/x%2Fy", False), ("/v1//x", False),
        ("/v1/x;p", False), ("*", False), ("/v1#x", False), ("/v1/%zz", False),
    ],
)  # fmt: skip
def test_only_a_path_with_one_reading_offers_standing_scopes(path: str, grantable: bool) -> None:
    assert offered(path, SCOPES) == (SCOPES if grantable else ("once",))


@pytest.mark.parametrize(
    ("headers", "target", "readings"),
    [
        ([], "/v1", {"GET"}),
        ([("X-HTTP-Method-Override", "post")], "/v1", {"GET", "POST"}),
        ([("x-http-method", "DELETE")], "/v1", {"GET", "DELETE"}),
        ([("X-Method-Override", "PATCH, put")], "/v1", {"GET", "PATCH", "PUT"}),
        ([], "/v1?_method=post", {"GET", "POST"}),
        ([], "/v1?%5FMETHOD=delete&x=1", {"GET", "DELETE"}),
        ([], "/v1?x=1&%5F%6D%65thod=put", {"GET", "PUT"}),  # no "method" as written
        (
            [("X-HTTP-Method-Override", "put"), ("x-http-method-override", "PATCH")],
            "/v1",
            {"GET", "PUT", "PATCH"},
        ),
        ([("X-Other", "POST")], "/v1?method=POST", {"GET"}),
    ],
)
def test_every_method_a_server_may_read_a_request_as_counts(
    headers: list[tuple[str, str]], target: str, readings: set[str]
) -> None:
    from mitmproxy.http import Headers

    from proxy.core.methods import method_readings

    got = method_readings("GET", Headers([(k.encode(), v.encode()) for k, v in headers]), target)
    assert got == readings
    assert Ask(frozenset({"POST"}), ("/v1",)).asks("GET", target, got) is ("POST" in readings)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"_method=DELETE", True),
        (b"id=1&%5fmethod=delete", True),
        (b"id=1&_%6Dethod=delete", True),
        (b'{"_method": "DELETE"}', True),
        (b'{"\\u005fmethod": "DELETE"}', True),
        (b'{"_\\u006dethod": "DELETE"}', True),
        (b'--b\r\nContent-Disposition: form-data; name="_method"\r\n\r\nDELETE\r\n--b--', True),
        (b'{"payment_method": "card"}', False),
        (b"id=1&method=DELETE", False),
        (b"", False),
    ],
)
def test_a_post_body_naming_method_is_seen_in_every_spelling(body: bytes, names: bool) -> None:
    from proxy.core.methods import body_names_method

    assert body_names_method(body) is names


def test_a_request_with_more_than_one_method_reading_offers_once_only() -> None:
    assert offered("/v1/x", SCOPES, one_method=False) == ("once",)
    ask = Ask(frozenset({"DELETE"}), ("/v1",))
    assert ask.body_may_ask("POST") and not ask.body_may_ask("GET")
    assert not Ask(frozenset({"POST", "DELETE"}), ("/v1",)).body_may_ask("POST")
    assert not Ask(frozenset(), ("/v1",)).body_may_ask("POST")  # every POST asks already


@pytest.mark.parametrize(
    ("headers", "target"),
    [
        ([("X_HTTP_Method_Override", "DELETE")], "/v1"),
        ([("x_http_method", "delete")], "/v1"),
        ([], "/v1?.method=DELETE"),
        ([], "/v1?%2Emethod=DELETE"),
        ([], "/v1?[method=DELETE"),
        ([], "/v1?_method[]=DELETE"),
        ([], "/v1?a=1;_method=DELETE"),
    ],
)
def test_spellings_a_server_reads_as_an_override_count(headers: list[tuple[str, str]], target: str) -> None:
    from mitmproxy.http import Headers

    from proxy.core.methods import method_readings

    got = method_readings("GET", Headers([(k.encode(), v.encode()) for k, v in headers]), target)
    assert got == {"GET", "DELETE"}


@pytest.mark.parametrize(
    "body",
    [
        b"id=1&.method=DELETE",
        b"[method=DELETE",
        b"--b\r\nContent-Disposition: form-data; name*=UTF-8''_%6Dethod\r\n\r\nDELETE\r\n--b--",
        b'--b\r\nContent-Disposition: form-data; name="_\\method"\r\n\r\nDELETE\r\n--b--',
        '\ufeff{"_\\u006dethod": "DELETE"}'.encode(),
        b"id=1;_me%74hod=DELETE",
    ],
)
def test_body_spellings_a_server_reads_as_method_count(body: bytes) -> None:
    from proxy.core.methods import body_names_method

    assert body_names_method(body)
