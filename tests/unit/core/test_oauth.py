"""OAuth token capture's pure parts: the declaration, reading token responses, rewriting them."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from proxy.core.hosts import HostPattern
from proxy.core.oauth import (
    CaptureError,
    OAuthSpec,
    check_head,
    check_other,
    endpoint_bound,
    parse_spec,
    read,
    rewrite,
    token_like,
)
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store

GOOD = {"token_endpoint": {"host": "Auth.Example.COM.", "path": "/oauth/token"}, "access_token": "acc"}


def test_a_declaration_parses_with_a_canonical_host() -> None:
    spec = parse_spec(GOOD)
    assert spec == OAuthSpec("auth.example.com", "/oauth/token", "acc", None)
    assert spec.matches("auth.example.com", "/oauth/token?x=1")
    assert not spec.matches("auth.example.com", "/oauth/token/x")
    assert spec.targets("ref") == {"access_token": "acc", "refresh_token": "ref", "id_token": None}
    assert parse_spec(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("x", "must be an object"),
        ({**GOOD, "extra": 1}, "unknown field(s) extra"),
        ({"access_token": "a"}, "token_endpoint must be"),
        ({"token_endpoint": {"host": "a.test"}}, "token_endpoint must be"),
        ({"token_endpoint": {"host": "a.test", "path": "oauth"}}, "path must start with '/'"),
        ({"token_endpoint": {"host": "a b", "path": "/t"}}, "token_endpoint.host"),
        ({"token_endpoint": {"host": "a.test", "path": "/t"}, "access_token": ""}, "oauth.access_token"),
    ],
    ids=["not-object", "unknown", "no-endpoint", "no-path", "bad-path", "bad-host", "empty-name"],
)
def test_bad_declarations_say_what_is_wrong(doc: object, says: str) -> None:
    with pytest.raises(ValueError, match=r".*") as info:
        parse_spec(doc)
    assert says in str(info.value)


def test_a_json_token_response_is_read_and_rewritten() -> None:
    body = json.dumps(
        {"access_token": "A", "refresh_token": "R", "id_token": "I", "expires_in": 3600}
    ).encode()
    got = read(body, "application/json; charset=utf-8")
    assert (got.tokens, got.expires_in) == (
        {"access_token": "A", "refresh_token": "R", "id_token": "I"},
        3600.0,
    )
    out = json.loads(rewrite(got, {"access_token": "surr_a", "refresh_token": "surr_r", "id_token": None}))
    assert out == {"access_token": "surr_a", "refresh_token": "surr_r", "id_token": None, "expires_in": 3600}


def test_a_form_token_response_is_read_and_rewritten() -> None:
    got = read(b"access_token=A%2B&expires_in=60&id_token=I&scope=x", "application/x-www-form-urlencoded")
    assert (got.tokens, got.expires_in) == ({"access_token": "A+", "id_token": "I"}, 60.0)
    out = parse_qsl(rewrite(got, {"access_token": "surr_a", "id_token": None}).decode())
    assert out == [("access_token", "surr_a"), ("expires_in", "60"), ("scope", "x")]


@pytest.mark.parametrize(
    ("body", "ctype", "says"),
    [
        (b"<html>", "text/html", "is not JSON"),
        (b"[1]", "application/json", "not an object"),
        (b"x" * (65 * 1024), "application/json", "over"),
        (b"\xff=1", "application/x-www-form-urlencoded", "not a valid form"),
    ],
    ids=["html", "array", "too-big", "bad-form"],
)
def test_unreadable_token_responses_are_refused_quoting_nothing(body: bytes, ctype: str, says: str) -> None:
    with pytest.raises(CaptureError, match=says) as info:
        read(body, ctype)
    assert "html" not in str(info.value).replace("text/html", "")


@pytest.mark.parametrize(
    "expires", [None, "soon", -5, 0, 1e12], ids=["absent", "text", "negative", "zero", "huge"]
)
def test_an_unusable_expires_in_sets_no_expiry(expires: object) -> None:
    assert (
        read(json.dumps({"access_token": "A", "expires_in": expires}).encode(), "application/json").expires_in
        is None
    )


def test_the_store_keeps_a_declaration_until_the_credential_goes(tmp_path: Path) -> None:
    with Store.open(tmp_path, KeyRing.load_or_create(tmp_path / "k.json")) as store:
        store.create_claim("c", "p")
        store.put_credential("c", "ref", value=b"v", hosts=["a.test"])
        store.set_oauth("c", "ref", parse_spec(GOOD).to_json())
        assert parse_spec(store.oauth_specs()["c", "ref"]) == parse_spec(GOOD)
        store.delete_credential("c", "ref")
        assert store.oauth_specs() == {}


@pytest.mark.parametrize(
    ("key", "like"),
    [
        ("access_token", True),
        ("idToken", True),
        ("ID_TOKEN", True),
        ("accesstoken", True),
        ("bot-token", True),
        ("client_secret", True),
        ("api_key", True),
        ("password", True),
        ("jwt", True),
        ("client_assertion", True),
        ("token_type", False),
        ("refresh_token_expires_in", False),
        ("expires_in", False),
        ("scope", False),
        ("key_id", False),
        ("bot_user_id", False),
    ],
)
def test_which_keys_are_token_like(key: str, like: bool) -> None:
    assert token_like(key) is like


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"access_token": "A", "authed_user": {"id": "U", "access_token": "B"}}, "authed_user.access_token"),
        ({"access_token": "A", "grants": [{"token": "B"}]}, "grants[0].token"),
        ({"access_token": "A", "id_token": {"jwt": "B"}}, "id_token (not a string)"),
        ({"access_token": ["A"]}, "access_token (not a string)"),
        ({"access_token": 1234}, "access_token (not a string)"),
        ({"access_token": "A", "ID_Token": "B"}, "ID_Token"),
        ({"idToken": "B"}, "idToken"),
        ({"access_token": "A", "x": {"y": [{"client_secret": "B"}]}}, "x.y[0].client_secret"),
        ({"access_token": "A", "tokens": {"a": "B"}}, "tokens"),
        ({"access_token": "A", "B" * 50 + "_token": "C"}, "<field>"),
    ],
    ids=[
        "slack",
        "list",
        "id-object",
        "list-value",
        "number",
        "upper",
        "camel",
        "deep",
        "container",
        "odd-key",
    ],
)
def test_an_unrecognised_token_like_field_refuses_the_response(doc: object, says: str) -> None:
    with pytest.raises(CaptureError) as info:
        read(json.dumps(doc).encode(), "application/json")
    assert says in str(info.value)
    assert "B" * 50 not in str(info.value)  # key names that do not look like names are not quoted


@pytest.mark.parametrize(
    "body",
    [b"access_token=A&bot_token=B", b"access_token=A&access_token=B", b"accessToken=A"],
    ids=["unknown", "twice", "camel"],
)
def test_a_form_with_an_unrecognised_or_repeated_token_is_refused(body: bytes) -> None:
    with pytest.raises(CaptureError):
        read(body, "application/x-www-form-urlencoded")


def test_harmless_fields_pass() -> None:
    doc = {"access_token": "A", "token_type": "Bearer", "expires_in": 60, "has_token": True, "key": None}
    assert read(json.dumps(doc).encode(), "application/json").tokens == {"access_token": "A"}


@pytest.mark.parametrize(
    ("body", "ctype", "refused"),
    [
        (b'{"error": "invalid_grant", "error_description": "no"}', "application/json", False),
        (b'{"error": "x", "access_token": "A"}', "application/json", True),
        (b'{"error": {"detail": {"refresh_token": "A"}}}', "application/problem+json", True),
        (b"error=x&access_token=A", "application/x-www-form-urlencoded", True),
        (b"<html>502</html>", "text/html", False),
        (b"not json", "application/json", False),
        # the class of a token in an answer whose label or shape is not a token response's
        (b'{"error": "x", "access_token": "A"}', "text/plain", True),
        (b'{"error": "x", "access_token": "A"}', "", True),
        (b"error=x&access_token=A&scope=a", "text/plain", True),
        (b"error: bad\naccess_token=A\n", "text/plain", True),
        (b'<html><p>"id_token": "A"</p></html>', "text/html", True),
        (b')]}\'\n{"access_token": "A"}', "application/json", True),
        (b'while(1);{"error": {"api_key": "A"}}', "application/json", True),
        (b'{"error": "x", "access_token": "A", "access_token": ""}', "application/json", True),
        (b"error=x&bot_token=A&bot_token=", "application/x-www-form-urlencoded", True),
        (b'{"error": "x", "id_tok\xd0\xb5n": "A"}', "application/json", True),
        (b'{"error": "x", "access_token": null, "refresh_token": ""}', "text/plain", False),
        (b"<html>token expired</html>", "text/html", False),
    ],
    ids=[
        "plain-error",
        "token-in-error",
        "nested-problem",
        "form",
        "html",
        "unparsable",
        "json-as-text",
        "json-no-type",
        "form-as-text",
        "text-line",
        "html-quoting-json",
        "xssi",
        "while1",
        "json-repeated-name",
        "form-repeated-name",
        "look-alike-letter",
        "empty-fields",
        "prose",
    ],
)
def test_an_error_answer_passes_only_without_token_like_fields(
    body: bytes, ctype: str, refused: bool
) -> None:
    if refused:
        with pytest.raises(CaptureError):
            check_other(body, ctype)
    else:
        check_other(body, ctype)


def test_the_endpoint_must_be_one_of_the_credentials_hosts() -> None:
    spec = parse_spec(GOOD)
    assert endpoint_bound(spec, [HostPattern.parse("auth.example.com")])
    assert endpoint_bound(spec, [HostPattern.parse("*.example.com")])
    assert not endpoint_bound(spec, [HostPattern.parse("api.example.com")])


@pytest.mark.parametrize(
    "body",
    [
        b'{"access_token": "A", "bot_token": "B", "bot_token": ""}',
        b'{"access_token": "A", "access_token": "B"}',
        b'{"access_token": "A", "id_tok\xd0\xb5n": "B"}',
    ],
    ids=["repeated-token-like", "repeated-recognised", "look-alike-letter"],
)
def test_a_captured_json_response_with_a_repeated_or_look_alike_name_is_refused(body: bytes) -> None:
    with pytest.raises(CaptureError):
        read(body, "application/json")


def test_a_captured_form_with_a_repeated_token_like_field_is_refused() -> None:
    # the last "bot_token" is empty: read as a dict, the real first one passed unchecked
    with pytest.raises(CaptureError, match="bot_token"):
        read(b"access_token=A&bot_token=B&bot_token=&token_type=Bearer", "application/x-www-form-urlencoded")


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ([("content-type", "application/json")], False),
        ([("x-access-token", "A")], True),
        ([("X-Api-Key", "A")], True),
        ([("location", "https://app.test/cb#access_token=A&token_type=Bearer")], True),
        ([("location", "https://app.test/cb?code=c&id_token=A")], True),
        ([("location", "https://app.test/cb?access%5Ftoken=A")], True),
        ([("location", "https://app.test/cb?code=c&state=s")], False),
        ([("location", "https://app.test/cb#access_token=&state=s")], False),
        ([("set-cookie", "sid=1"), ("set-cookie", "refresh_token=A; Secure")], True),
        ([("refresh", "0; url=https://app.test/cb#id_token=A")], True),
        ([("link", "<https://app.test/?refresh%5Ftoken=A>; rel=next")], True),
        ([("x-debug", '{"client_secret": "A"}')], True),
        ([("www-authenticate", 'Bearer realm="api", error="invalid_token"')], False),
        ([("access-control-allow-headers", "Authorization, X-Api-Key")], False),
    ],
    ids=[
        "plain",
        "token-header",
        "key-header",
        "fragment",
        "query",
        "escaped-name",
        "code-flow",
        "empty",
        "cookie",
        "refresh",
        "escaped-link",
        "json-value",
        "bearer-error",
        "cors-names",
    ],
)
def test_the_head_of_a_token_endpoint_answer_carries_no_token(
    headers: list[tuple[str, str]], refused: bool
) -> None:
    from mitmproxy.http import Headers

    h = Headers([(k.encode(), v.encode()) for k, v in headers])
    if refused:
        with pytest.raises(CaptureError):
            check_head(h)
    else:
        check_head(h)
