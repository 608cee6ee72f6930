"""OAuth token capture end to end, against a fake authorization server on loopback: the initial
tokens come through the control API, the sandbox refreshes with its placeholder (swapped in the
form body), the upstream sees real tokens, the sandbox only placeholders, the store the new
versions (which the next request uses)."""

from __future__ import annotations

import zlib
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
    """The access token replaced by a capture stays live for scrubbing (proxy.store.live)."""
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
    # hostile review (r1): a server that decodes before it splits off the query (Apache's
    # "confusion attacks", CVE-2024-38474) routes /oauth/token%3Fx to /oauth/token
    ("/oauth/token%3Fx", "encoded-question-mark"),
    ("/oauth/token%23", "encoded-number-sign"),
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
# -- issue 13, class 6: capture reads the raw body and fails closed ----------------------------


@pytest.fixture
def reply(world: World) -> Iterator[None]:
    """Each test sets ``world.upstream.oauth_reply``; put the RFC 6749 answer back after it."""
    yield
    world.upstream.oauth_reply = None
    world.upstream.oauth_gzip = False


def _oauth_claim(world: World, claim: str) -> tuple[str, str, str]:
    """A store claim with an access credential and a refresh credential capturing at
    api.test/oauth/token; returns (proxy token, refresh placeholder, access placeholder)."""
    refresh = world.canary()
    world.upstream.oauth_refresh = refresh
    spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": claim, "pool": "p"}).json()["proxy_token"]
        access = api.put(
            f"/v1/claims/{claim}/credentials/access", json={"hosts": ["api.test"], "value": world.canary()}
        ).json()["placeholder"]
        r = api.put(
            f"/v1/claims/{claim}/credentials/refresh",
            json={"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec},
        )
        assert r.status_code == 201, r.text
    return token, r.json()["placeholder"], access


def _post_refresh(world: World, claim: str, token: str, placeholder: str, query: str) -> httpx.Response:
    with world.client(claim, token) as client:
        return client.post(
            world.url(f"/oauth/token?{query}=1"),
            data={"grant_type": "refresh_token", "refresh_token": placeholder},
        )


@pytest.mark.parametrize("gzip", [False, True], ids=["identity", "gzip"])
def test_an_endpoint_handing_back_the_same_refresh_token_keeps_its_real_value(
    world: World, reply: None, gzip: bool
) -> None:
    """Capture reads the upstream's body, not the scrubbed one: the unchanged refresh token (which
    the scrubber would turn into its own placeholder) is stored as itself."""
    claim = f"oa-same-{int(gzip)}"
    token, refresh_ph, access_ph = _oauth_claim(world, claim)
    world.upstream.oauth_gzip = gzip
    world.upstream.oauth_reply = lambda issued, presented: (
        200,
        {"access_token": issued["access_token"], "refresh_token": presented, "token_type": "Bearer"},
    )
    for _ in range(2):
        r = _post_refresh(world, claim, token, refresh_ph, claim)
        world.canaries += list(world.upstream.oauth_issued[-1].values())
        assert r.status_code == 200, r.text
        assert r.json()["refresh_token"] == refresh_ph and r.json()["access_token"] == access_ph
        assert world.upstream.oauth_refresh not in r.text
        assert world.upstream.oauth_issued[-1]["access_token"] not in r.text
    # the second refresh sent the real refresh token again, not the placeholder stored as its value
    assert world.upstream.oauth_seen[-2:] == [world.upstream.oauth_refresh] * 2


SLACK = "slack"  # oauth.v2.access: the user token nested under authed_user


def _shape(name: str, issued: dict[str, str]) -> tuple[int, object]:
    a, i = issued["access_token"], issued["id_token"]
    return {
        SLACK: (200, {"ok": True, "access_token": a, "authed_user": {"id": "U1", "access_token": i}}),
        "nested-list": (200, {"access_token": a, "grants": [{"scope": "x", "token": i}]}),
        "id-token-object": (200, {"access_token": a, "id_token": {"jwt": i}}),
        "id-token-list": (200, {"access_token": a, "id_token": [i]}),
        "access-token-number": (200, {"access_token": 12345678901234, "refresh_token": a}),
        "upper-case": (200, {"access_token": a, "ID_TOKEN": i}),
        "camel-case": (200, {"access_token": a, "idToken": i}),
        "glued": (200, {"accesstoken": a}),
        "bot-token": (200, {"access_token": a, "bot_token": i}),
        "client-secret": (200, {"access_token": a, "client_secret": i}),
        "only-unknown": (200, {"token": a}),
        "error-with-token": (400, {"error": "invalid_grant", "access_token": a}),
    }[name]


@pytest.mark.parametrize(
    "shape",
    [
        SLACK,
        "nested-list",
        "id-token-object",
        "id-token-list",
        "access-token-number",
        "upper-case",
        "camel-case",
        "glued",
        "bot-token",
        "client-secret",
        "only-unknown",
        "error-with-token",
    ],
)
def test_a_token_like_field_capture_does_not_recognise_is_never_passed(
    world: World, reply: None, shape: str
) -> None:
    claim = f"oa-u-{shape}"
    token, refresh_ph, _ = _oauth_claim(world, claim)
    world.upstream.oauth_reply = lambda issued, _presented: _shape(shape, issued)
    got = b""
    try:
        r = _post_refresh(world, claim, token, refresh_ph, claim)
        got = r.content
    except httpx.HTTPError:
        pass  # the connection was closed: nothing reached the sandbox
    issued = world.upstream.oauth_issued[-1]
    world.canaries += list(issued.values())
    assert not any(v.encode() in got for v in issued.values()), shape
    assert got == b"", shape
    event = world.proxy.wait_event(path=f"/oauth/token?{claim}=REDACTED")
    assert event["reason"] == "unscannable_response"
    # and nothing was stored from it
    with world.api() as api:
        assert api.get(f"/v1/claims/{claim}/credentials/access").json()["version"] == 1


def test_a_token_endpoint_error_without_tokens_passes(world: World, reply: None) -> None:
    token, refresh_ph, _ = _oauth_claim(world, "oa-err")
    world.upstream.oauth_reply = lambda _i, _p: (400, {"error": "invalid_grant", "error_description": "no"})
    r = _post_refresh(world, "oa-err", token, refresh_ph, "oa-err")
    world.canaries += list(world.upstream.oauth_issued[-1].values())
    assert (r.status_code, r.json()["error"]) == (400, "invalid_grant")


def test_a_token_endpoint_outside_the_credentials_hosts_is_refused_when_written(world: World) -> None:
    """other.test is allowed by the pool and intercepted, but not one of the credential's hosts:
    it could hand out tokens the store would then send to api.test."""
    spec = {"token_endpoint": {"host": "other.test", "path": "/oauth/token"}, "access_token": "access"}
    with world.api() as api:
        api.post("/v1/claims", json={"id": "oa-host", "pool": "p"})
        r = api.put(
            "/v1/claims/oa-host/credentials/refresh",
            json={"hosts": ["api.test"], "value": world.canary(), "oauth": spec},
        )
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "oauth.token_endpoint.host" and "other.test" in r.json()["message"]
        # uncovered by any rule of the pool: 422 too
        spec["token_endpoint"]["host"] = "nowhere.test"
        r = api.put(
            "/v1/claims/oa-host/credentials/refresh",
            json={"hosts": ["api.test"], "value": world.canary(), "oauth": spec},
        )
        assert r.status_code == 422 and r.json()["field"] == "oauth.token_endpoint.host"
        # a PATCH that would drop the endpoint's host from hosts: 422, nothing changed
        spec["token_endpoint"]["host"] = "api.test"
        ok = api.put(
            "/v1/claims/oa-host/credentials/refresh",
            json={"hosts": ["api.test", "other.test"], "value": world.canary(), "oauth": spec},
        )
        assert ok.status_code == 201, ok.text
        r = api.patch("/v1/claims/oa-host/credentials/refresh", json={"hosts": ["other.test"]})
        assert r.status_code == 422 and r.json()["field"] == "oauth.token_endpoint.host"
        assert api.get("/v1/claims/oa-host/credentials/refresh").json()["version"] == 1


# -- hostile review (r1): a refresh token presented at another token URL of its host ---------


@pytest.mark.parametrize("status", [200, 400], ids=["grant", "error-with-tokens"])
def test_a_refresh_token_presented_at_another_token_url_never_brings_real_tokens_back(
    world: World, reply: None, status: int
) -> None:
    """Was: the credential declares api.test/oauth/token; the sandbox POSTed its refresh-token
    placeholder to /oauth/v1/token, a second token URL of the same server. Body substitution
    swapped the real refresh token in (the host is bound), capture did not look (another path),
    and the fresh real access, refresh and id tokens reached the sandbox: the scrubber knows
    none of them. Now the answer to a request that presented a refresh token is read whole and
    refused when it holds a token-like field; nothing is stored from it."""
    claim = f"oa-alias-{status}"
    token, refresh_ph, _ = _oauth_claim(world, claim)
    world.upstream.oauth_reply = lambda issued, _presented: (status, {**issued, "token_type": "Bearer"})
    got = b""
    try:
        with world.client(claim, token) as client:
            r = client.post(
                world.url(f"/oauth/v1/token?{claim}=1"),
                data={"grant_type": "refresh_token", "refresh_token": refresh_ph},
            )
        got = r.content
    except httpx.HTTPError:
        pass  # the connection was closed: nothing reached the sandbox
    issued = world.upstream.oauth_issued[-1]
    world.canaries += list(issued.values())
    assert world.upstream.oauth_seen[-1] == world.upstream.oauth_refresh  # the real one was sent
    assert not any(v.encode() in got for v in issued.values())
    assert got == b""
    event = world.proxy.wait_event(path=f"/oauth/v1/token?{claim}=REDACTED")
    assert event["reason"] == "unscannable_response"
    with world.api() as api:
        assert api.get(f"/v1/claims/{claim}/credentials/access").json()["version"] == 1


def test_an_answer_without_tokens_to_a_presented_refresh_token_passes(world: World, reply: None) -> None:
    """A revocation-style answer (RFC 7009: 200 with no token in it) to the refresh token passes."""
    token, refresh_ph, _ = _oauth_claim(world, "oa-alias-ok")
    world.upstream.oauth_reply = lambda _i, _p: (200, {"revoked": True})
    with world.client("oa-alias-ok", token) as client:
        r = client.post(
            world.url("/oauth/v1/token"), data={"grant_type": "refresh_token", "refresh_token": refresh_ph}
        )
    world.canaries += list(world.upstream.oauth_issued[-1].values())
    assert (r.status_code, r.json()) == (200, {"revoked": True})


# -- hostile review (r4): a transfer coding hides the tokens from capture ----------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [("/oauth/token", 200), ("/oauth/token", 400), ("/oauth/v1/token", 200), ("/oauth/v1/token", 400)],
    ids=["endpoint-grant", "endpoint-error-with-tokens", "alias-grant", "alias-error-with-tokens"],
)
def test_tokens_under_a_transfer_coding_never_reach_the_sandbox(
    world: World, reply: None, path: str, status: int
) -> None:
    """Was: the answer came as ``Transfer-Encoding: gzip, chunked`` (RFC 9112 §7). mitmproxy
    passed the body still gzip; capture could not parse it and let an error answer, or the
    answer at another token URL, through as "not a token response", with the TE rewritten to
    plain chunked: the sandbox gunzipped fresh real tokens no scrubber knows. Now refused."""
    claim = f"oa-te-{path.count('/')}-{status}"
    token, refresh_ph, _ = _oauth_claim(world, claim)
    world.upstream.oauth_gzip = "transfer"
    world.upstream.oauth_reply = lambda issued, _presented: (status, {**issued, "token_type": "Bearer"})
    got = b""
    try:
        with world.client(claim, token) as client:
            form = {"grant_type": "refresh_token", "refresh_token": refresh_ph}
            r = client.post(world.url(f"{path}?{claim}=1"), data=form)
        got = r.content
    except httpx.HTTPError:
        pass  # the connection was closed: nothing reached the sandbox
    issued = world.upstream.oauth_issued[-1]
    world.canaries += list(issued.values())
    for data in (got, *_gunzipped(got)):
        assert not any(v.encode() in data for v in issued.values()), data[:200]
    assert b"\x1f\x8b" not in got
    event = world.proxy.wait_event(path=f"{path}?{claim}=REDACTED")
    assert event["reason"] == "unscannable_response", event
    with world.api() as api:
        assert api.get(f"/v1/claims/{claim}/credentials/access").json()["version"] == 1


def _gunzipped(data: bytes) -> list[bytes]:
    try:
        return [zlib.decompressobj(47).decompress(data)]
    except zlib.error:
        return []
