"""OAuth token capture end to end, against a fake authorization server on loopback: the initial
tokens come through the control API, the sandbox refreshes with its placeholder (swapped in the
form body), the upstream sees real tokens, the sandbox only placeholders, the store the new
versions (which the next request uses)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_control import World
from test_control import world as world  # noqa: F401  # the module's proxy, upstream and API

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def oauth(world: World) -> Iterator[tuple[str, dict[str, str]]]:
    """A store claim holding a refresh token (captures at api.test/oauth/token) and an access
    token; returns its proxy token and the placeholders."""
    refresh, access = world.canary(), world.canary()
    world.upstream.oauth_refresh = refresh
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "oa", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/oa/credentials/access", json={"hosts": ["api.test"], "value": access})
        assert r.status_code == 201, r.text
        spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
        r2 = api.put(
            "/v1/claims/oa/credentials/refresh",
            json={"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec},
        )
        assert r2.status_code == 201, r2.text
    yield token, {"access": r.json()["placeholder"], "refresh": r2.json()["placeholder"], "initial": access}


def _refresh(world: World, token: str, placeholder: str) -> dict[str, object]:
    with world.client("oa", token) as client:
        r = client.post(
            world.url("/oauth/token"),
            data={"grant_type": "refresh_token", "refresh_token": placeholder},
        )
    assert r.status_code == 200, r.text
    for c in world.upstream.oauth_issued:  # nothing the fake server issued reaches the sandbox
        assert not any(v in r.text for v in c.values())
    return r.json()


def test_a_refresh_by_the_sandbox_is_captured_and_used(
    world: World, oauth: tuple[str, dict[str, str]]
) -> None:
    token, ph = oauth
    got = _refresh(world, token, ph["refresh"])
    [issued] = world.upstream.oauth_issued
    world.canaries += list(issued.values())
    assert world.upstream.oauth_seen == [world.upstream.oauth_refresh]  # the real refresh token
    assert got["access_token"] == ph["access"] and got["refresh_token"] == ph["refresh"]
    assert got["id_token"] is None  # no credential receives it: withheld
    assert got["expires_in"] == 3600 and got["token_type"] == "Bearer"
    # the store holds the new versions, the access token with its expiry
    with world.api() as api:
        access = api.get("/v1/claims/oa/credentials/access").json()
        refresh = api.get("/v1/claims/oa/credentials/refresh").json()
    assert (access["version"], refresh["version"]) == (2, 2)
    expires = access["expires_at"]
    assert expires is not None
    # the next request carries the captured access token
    with world.client("oa", token) as client:
        assert (
            client.get(world.url("/oa/api"), headers={"Authorization": f"Bearer {ph['access']}"}).status_code
            == 200
        )
    assert world.sent("/oa/api", "Authorization") == [f"Bearer {issued['access_token']}"]
    # a second refresh sends the rotated refresh token
    _refresh(world, token, ph["refresh"])
    world.canaries += list(world.upstream.oauth_issued[-1].values())
    assert world.upstream.oauth_seen[-1] == issued["refresh_token"]


def test_a_reflected_old_access_token_is_still_scrubbed(
    world: World, oauth: tuple[str, dict[str, str]]
) -> None:
    """The access token replaced by a capture stays live for scrubbing (proxy.live)."""
    token, ph = oauth
    _refresh(world, token, ph["refresh"])
    world.canaries += list(world.upstream.oauth_issued[-1].values())
    with world.client("oa", token) as client:
        r = client.post(
            world.url("/echo"),
            content=ph["initial"].encode() + b" " + world.upstream.oauth_issued[0]["access_token"].encode(),
        )
    assert r.status_code == 200
    assert ph["initial"] not in r.text and world.upstream.oauth_issued[0]["access_token"] not in r.text
    assert r.text.count(ph["access"]) >= 2


def test_a_bad_declaration_is_a_422_naming_the_field(world: World) -> None:
    with world.api() as api:
        api.post("/v1/claims", json={"id": "oa-bad", "pool": "p"})
        r = api.put(
            "/v1/claims/oa-bad/credentials/r",
            json={
                "hosts": ["api.test"],
                "value": world.canary(),
                "oauth": {"token_endpoint": {"host": "api.test"}},
            },
        )
    assert r.status_code == 422
    assert "token_endpoint" in r.text


def test_a_token_response_that_cannot_be_stored_is_not_passed(world: World) -> None:
    """The receiving credential does not exist: the real tokens must not reach the sandbox."""
    refresh = world.canary()
    world.upstream.oauth_refresh = refresh
    spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "missing"}
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "oa-miss", "pool": "p"}).json()["proxy_token"]
        ph = api.put(
            "/v1/claims/oa-miss/credentials/r",
            json={"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec},
        ).json()["placeholder"]
    with world.client("oa-miss", token) as client, pytest.raises(httpx.HTTPError):
        client.post(
            world.url("/oauth/token?miss=1"), data={"grant_type": "refresh_token", "refresh_token": ph}
        )
    world.canaries += list(world.upstream.oauth_issued[-1].values())
    event = world.proxy.wait_event(path="/oauth/token?miss=REDACTED")
    assert event["reason"] == "unscannable_response"
    assert "'missing'" in event["message"]


# --- issue 13, class 1: the token endpoint is matched on the canonical path --------------------

SPELLINGS = [
    ("/oauth/%74oken", "encoded-unreserved-letter"),
    ("/oauth/%74%6F%6b%65%6E", "mixed-case-escapes"),
    ("/%6Fauth/token", "encoded-first-segment"),
    ("/oauth/token/", "trailing-slash"),
    ("/oauth//token", "doubled-slash"),
    ("/oauth/token;v=1", "matrix-param"),
    ("/oauth;x/token", "param-on-a-parent-segment"),
]


@pytest.mark.parametrize("path", [s[0] for s in SPELLINGS], ids=[s[1] for s in SPELLINGS])
def test_every_spelling_of_the_token_endpoint_is_captured(
    world: World, oauth: tuple[str, dict[str, str]], path: str
) -> None:
    """The fake server routes each spelling to /oauth/token, as lenient frameworks do; the
    sandbox must get placeholders, never the fresh real tokens (POST /%74oken used to get them)."""
    token, ph = oauth
    before = len(world.upstream.oauth_issued)
    with world.client("oa", token) as client:
        r = client.post(world.url(path), data={"grant_type": "refresh_token", "refresh_token": ph["refresh"]})
    assert len(world.upstream.oauth_issued) == before + 1, r.text  # the server did issue tokens
    issued = world.upstream.oauth_issued[-1]
    world.canaries += list(issued.values())
    assert r.status_code == 200, r.text
    assert not any(v in r.text for v in issued.values())
    got = r.json()
    assert (got["access_token"], got["refresh_token"]) == (ph["access"], ph["refresh"])


AMBIGUOUS = [
    ("/oauth/%2e/token", "encoded-dot-segment"),
    ("/oauth/x/%2E%2E/token", "encoded-dot-dot"),
    ("/oauth%2ftoken", "encoded-slash"),
    ("/oauth%5Ctoken", "encoded-backslash"),
    ("/oauth/%2574oken", "double-encoding"),
    ("/oauth/tok%00en", "encoded-nul"),
    ("/oauth/%u0074oken", "iis-u-escape"),
    ("/oauth/%C0%AEtoken", "overlong-utf8"),
]


@pytest.mark.parametrize("path", [s[0] for s in AMBIGUOUS], ids=[s[1] for s in AMBIGUOUS])
def test_an_ambiguous_path_to_a_token_endpoint_host_is_refused_before_the_upstream(
    world: World, oauth: tuple[str, dict[str, str]], path: str
) -> None:
    token, ph = oauth
    up = world.upstream
    before = len(up.oauth_issued), len(up.oauth_seen), len(up.requests)
    with world.client("oa", token) as client:
        r = client.post(world.url(path), data={"grant_type": "refresh_token", "refresh_token": ph["refresh"]})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "ambiguous_path"
    assert path not in r.text  # the refusal names what is ambiguous, never the path
    assert (len(up.oauth_issued), len(up.oauth_seen), len(up.requests)) == before  # never sent
