"""OAuth token capture's pure parts: the declaration, reading token responses, rewriting them."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

from proxy.keyring import KeyRing
from proxy.oauth import CaptureError, OAuthSpec, parse_spec, read, rewrite
from proxy.store import Store

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
