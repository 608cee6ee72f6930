"""proxy.core.mint: token responses (RFC 6749 §5.1/§5.2), token requests (§2.3.1, §4.4, §6;
RFC 7523 §2.1/§2.2), the cache decisions as functions of ``now``, and the slot."""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qsl

import pytest

from proxy.core import mint
from proxy.core.errors import SecretUnavailable
from proxy.core.secrets import Secret

URL = mint.TokenURL.parse("https://auth.test/oauth/token")
SECRET = Secret("s3cr:et/+")


def _ok(**doc: object) -> bytes:
    return json.dumps({"access_token": "at-1", "token_type": "Bearer", **doc}).encode()


def test_a_token_response_gives_the_token_and_its_expiry() -> None:
    t = mint.parse_token_response(200, "application/json", _ok(expires_in=60, refresh_token="rt-2"), 1000.0)
    assert t.value.reveal() == "at-1" and t.expires_at == 1060.0 and t.refresh_token == Secret("rt-2")
    assert "at-1" not in repr(t)


def test_a_token_without_expires_in_is_kept_the_default_lifetime() -> None:
    t = mint.parse_token_response(200, "application/json", _ok(), 0.0)
    assert t.expires_at == mint.DEFAULT_LIFETIME


BAD = [
    ("error-with-code", 400, b'{"error":"invalid_client","error_description":"LEAK"}', "http_400:invalid_client"),  # noqa: E501
    ("error-bad-code", 401, b'{"error":"bad\\"code LEAK"}', "http_401:unregistered"),
    # a hostile endpoint answers ``error`` with what it was sent (the client secret, the refresh
    # token, the assertion): well within RFC 6749 §5.2's charset, so only registered codes pass
    ("error-echoes-secret", 400, b'{"error":"LEAKclientsecret0123456789abcdef"}', "http_400:unregistered"),
    ("error-echoes-basic", 401, b'{"error":"Basic LEAKY2xpZW50OnNlY3JldA=="}', "http_401:unregistered"),
    ("error-near-code", 400, b'{"error":"invalid_client LEAK"}', "http_400:unregistered"),
    ("error-other-case", 400, b'{"error":"INVALID_CLIENT"}', "http_400:unregistered"),
    ("error-not-str", 400, b'{"error":["LEAK"]}', "http_400"),
    ("error-not-json", 500, b"LEAK", "http_500"),
    ("not-json", 200, b"LEAK", "bad_response"),
    ("no-token", 200, b'{"token_type":"Bearer"}', "bad_response"),
    ("control-char", 200, b'{"access_token":"a\\nb"}', "bad_response"),
    ("not-bearer", 200, b'{"access_token":"a","token_type":"mac"}', "bad_response"),
    ("negative-expiry", 200, b'{"access_token":"a","expires_in":-1}', "bad_response"),
    ("bool-expiry", 200, b'{"access_token":"a","expires_in":true}', "bad_response"),
    ("refresh-not-str", 200, b'{"access_token":"a","refresh_token":5}', "bad_response"),
    ("too-large", 200, b" " * (mint.MAX_BODY + 1), "bad_response"),
]  # fmt: skip


@pytest.mark.parametrize(("status", "body", "code"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_token_response_is_a_mint_error_that_never_quotes_the_body(
    status: int, body: bytes, code: str
) -> None:
    with pytest.raises(mint.MintError) as info:
        mint.parse_token_response(status, "application/json", body, 0.0)
    assert info.value.code == code
    assert "LEAK" not in str(info.value) + info.value.code


@pytest.mark.parametrize(
    ("now", "fresh"), [(0.0, True), (69.9, True), (70.0, False), (100.0, False)], ids=str
)
def test_a_token_is_fresh_until_margin_seconds_before_expiry(now: float, fresh: bool) -> None:
    token = mint.Token(Secret("t"), 100.0)
    assert mint.fresh(token, now, 30.0) is fresh
    assert not mint.fresh(None, now, 30.0)


def _form(body: bytes) -> dict[str, str]:
    return dict(parse_qsl(body.decode()))


def test_client_credentials_with_basic_auth_form_encodes_id_and_secret() -> None:
    spec = mint.MintSpec(URL, "my id", scopes=("read", "write"), audience="https://api.test")
    headers, body = mint.token_request(spec, SECRET, None, None)
    auth = dict(headers)["authorization"]
    assert base64.b64decode(auth.removeprefix("Basic ")).decode() == "my%20id:s3cr%3Aet%2F%2B"
    assert _form(body) == {
        "grant_type": "client_credentials",
        "scope": "read write",
        "audience": "https://api.test",
    }


def test_secret_post_puts_the_secret_in_the_form() -> None:
    spec = mint.MintSpec(URL, "cid", client_auth="secret_post")
    headers, body = mint.token_request(spec, SECRET, None, None)
    assert "authorization" not in dict(headers)
    assert _form(body) == {
        "grant_type": "client_credentials",
        "client_id": "cid",
        "client_secret": "s3cr:et/+",
    }


def test_refresh_token_grant_sends_the_refresh_token_and_needs_one() -> None:
    spec = mint.MintSpec(URL, "cid", grant="refresh_token", client_auth="secret_post")
    _, body = mint.token_request(spec, SECRET, Secret("rt"), None)
    assert _form(body)["grant_type"] == "refresh_token" and _form(body)["refresh_token"] == "rt"
    with pytest.raises(mint.MintError) as info:
        mint.token_request(spec, SECRET, None, None)
    assert info.value.code == "no_refresh_token"


def test_jwt_bearer_sends_the_assertion_and_private_key_jwt_the_client_assertion() -> None:
    spec = mint.MintSpec(URL, "cid", grant="jwt_bearer", client_auth="none")
    _, body = mint.token_request(spec, SECRET, None, "A.B.C")
    assert _form(body) == {"grant_type": mint.JWT_BEARER, "assertion": "A.B.C", "client_id": "cid"}
    spec = mint.MintSpec(URL, "cid", client_auth="private_key_jwt")
    _, body = mint.token_request(spec, SECRET, None, "A.B.C")
    assert _form(body)["client_assertion_type"] == mint.ASSERTION_TYPE
    assert _form(body)["client_assertion"] == "A.B.C"


def test_assertion_claims_follow_rfc_7523() -> None:
    spec = mint.MintSpec(URL, "cid", grant="jwt_bearer", subject="user@x", client_auth="none")
    claims = mint.assertion_claims(spec, 1000.7, "j1")
    assert claims == {"iss": "cid", "sub": "user@x", "aud": "https://auth.test/oauth/token",
                      "iat": 1000, "exp": 1300, "jti": "j1"}  # fmt: skip


def test_the_slot_counts_generations_and_drops_a_refused_token_once() -> None:
    slot = mint.TokenSlot()
    with pytest.raises(SecretUnavailable):
        slot.current()
    slot.store(mint.Token(Secret("a"), 10.0))
    slot.store(mint.Token(Secret("b"), 20.0, Secret("r2")))
    assert slot.current() == (Secret("b"), 2)
    assert Secret("a") in slot.previous(0.0) and Secret("r2") in slot.previous(0.0)
    assert not slot.drop(1)  # a 401 on an older token: the newer one stays
    assert slot.drop(2) and slot.token is None and not slot.drop(2)
