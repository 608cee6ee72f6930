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
