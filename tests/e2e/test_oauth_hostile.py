"""A token endpoint that puts fresh real tokens where capture did not look (issue 19's attack
session, 2026-12-04): in the head (a token-like header, a header value such as
``Set-Cookie: refresh_token=…``, ``Refresh`` or a percent-encoded ``Link``, the implicit
grant's ``Location`` fragment, RFC 6749 §4.2.2), in an answer not labelled JSON or a form, behind an anti-XSSI
prefix, under a name given twice (``bot_token=<real>&bot_token=`` read as a dict took the empty
one), or a name spelled with a look-alike letter. Each reached the sandbox whole through a real
proxy; now each answer is refused (the connection closed, audited ``unscannable_response``) and
nothing the endpoint issued reaches the sandbox, at the declared endpoint and at the provider's
second token URL where the refresh placeholder was presented."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from test_control import World
from test_control import world as world  # noqa: F401  # the module's proxy, upstream and API

pytestmark = pytest.mark.e2e

Answer = Callable[[dict[str, str]], tuple[int, list[tuple[str, str]], bytes]]
JSON = [("Content-Type", "application/json")]
FORM = [("Content-Type", "application/x-www-form-urlencoded")]


def _doc(t: dict[str, str], **more: str) -> bytes:
    return json.dumps({"token_type": "Bearer", "access_token": t["access_token"], **more}).encode()


ANSWERS: dict[str, Answer] = {
    "location-fragment": lambda t: (
        302,
        [("Location", f"https://app.test/cb#access_token={t['access_token']}&token_type=Bearer")],
        b"",
    ),
    "location-query": lambda t: (
        303,
        [("Location", f"https://app.test/cb?code=c&id_token={t['id_token']}")],
        b"",
    ),
    "token-header": lambda t: (200, [*JSON, ("X-Access-Token", t["refresh_token"])], _doc(t)),
    "set-cookie": lambda t: (
        200,
        [*JSON, ("Set-Cookie", f"refresh_token={t['refresh_token']}; Secure")],
        _doc(t),
    ),
    "refresh-header": lambda t: (
        200,
        [*JSON, ("Refresh", f"0; url=https://app.test/cb#id_token={t['id_token']}")],
        _doc(t),
    ),
    "percent-encoded-header": lambda t: (
        400,
        [*JSON, ("Link", f"<https://app.test/cb?refresh%5Ftoken={t['refresh_token']}>; rel=next")],
        b'{"error": "invalid_grant"}',
    ),
    "error-text-plain": lambda t: (
        400,
        [("Content-Type", "text/plain")],
        json.dumps({"error": "x", "access_token": t["access_token"]}).encode(),
    ),
    "error-no-content-type": lambda t: (500, [], json.dumps({"refresh_token": t["refresh_token"]}).encode()),
    "error-text-line": lambda t: (
        400,
        [("Content-Type", "text/plain")],
        f"id_token={t['id_token']}\n".encode(),
    ),
    "error-xssi": lambda t: (400, JSON, b")]}'\n" + json.dumps({"access_token": t["access_token"]}).encode()),
    "error-form-repeated": lambda t: (
        400,
        FORM,
        f"error=x&access_token={t['access_token']}&access_token=".encode(),
    ),
    "error-json-repeated": lambda t: (
        400,
        JSON,
        b'{"error": "x", "id_token": "%s", "id_token": ""}' % t["id_token"].encode(),
    ),
    "ok-form-repeated": lambda t: (
        200,
        FORM,
        f"access_token={t['access_token']}&bot_token={t['id_token']}&bot_token=&token_type=Bearer".encode(),
    ),
    "ok-json-repeated": lambda t: (
        200,
        JSON,
        b'{"access_token": "%s", "bot_token": "%s", "bot_token": ""}'
        % (t["access_token"].encode(), t["id_token"].encode()),
    ),
    "ok-look-alike-letter": lambda t: (
        200,
        JSON,
        json.dumps({"access_token": t["access_token"], "id_tok\u0435n": t["id_token"]}).encode(),
    ),
}
ALIAS = [
    "location-fragment",
    "token-header",
    "percent-encoded-header",
    "error-text-plain",
    "error-xssi",
    "ok-form-repeated",
    "ok-json-repeated",
]


def _claim(world: World, claim: str) -> tuple[str, str]:
    refresh = world.canary()
    world.upstream.oauth_refresh = refresh
    spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": claim, "pool": "p"}).json()["proxy_token"]
        r = api.put(
            f"/v1/claims/{claim}/credentials/access", json={"hosts": ["api.test"], "value": world.canary()}
        )
        assert r.status_code == 201, r.text
        r = api.put(
            f"/v1/claims/{claim}/credentials/refresh",
            json={"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec},
        )
        assert r.status_code == 201, r.text
    return token, r.json()["placeholder"]


def _attack(world: World, claim: str, path: str, answer: Answer) -> tuple[bytes, dict[str, str]]:
    """What the sandbox got (status, head and body; empty when the proxy closed the connection)."""
    token, placeholder = _claim(world, claim)
    world.upstream.oauth_raw = answer
    got = b""
    try:
        with world.client(claim, token) as client:
            r = client.post(
                world.url(path), data={"grant_type": "refresh_token", "refresh_token": placeholder}
            )
            got = f"{r.status_code}\n".encode() + json.dumps(r.headers.multi_items()).encode() + r.content
    except httpx.HTTPError:
        pass  # refused: the connection is closed
    finally:
        world.upstream.oauth_raw = None
    issued = world.upstream.oauth_issued[-1]
    world.canaries += list(issued.values())  # the session-wide scan seeks them in every file too
    assert world.upstream.oauth_seen[-1] == world.upstream.oauth_refresh  # the endpoint did issue
    return got, issued


@pytest.mark.parametrize("shape", list(ANSWERS))
def test_a_token_the_declared_endpoint_hides_from_capture_never_reaches_the_sandbox(
    world: World, shape: str
) -> None:
    got, issued = _attack(world, f"oh-{shape}", "/oauth/token", ANSWERS[shape])
    assert not [k for k, v in issued.items() if v.encode() in got], got[:400]
    event = world.proxy.wait_event(claim=f"oh-{shape}", path="/oauth/token")
    assert event["reason"] == "unscannable_response", event


@pytest.mark.parametrize("shape", ALIAS)
def test_a_token_another_token_url_hides_never_reaches_the_sandbox(world: World, shape: str) -> None:
    got, issued = _attack(world, f"oa2-{shape}", "/oauth/v1/token", ANSWERS[shape])
    assert not [k for k, v in issued.items() if v.encode() in got], got[:400]


def test_an_error_answer_without_tokens_still_passes(world: World) -> None:
    got, _ = _attack(
        world, "oh-plain-error", "/oauth/token", lambda t: (400, JSON, b'{"error": "invalid_grant"}')
    )
    assert got.startswith(b"400\n") and got.endswith(b'{"error": "invalid_grant"}')
