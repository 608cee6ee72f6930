"""proxy.control.routes, in process: each route's status, body and ETag over a real store (temp
SQLite + key file) and the rules the proxy would load."""

from __future__ import annotations

import httpx

from proxy.control.service import Control
from unit.control.world import SECRET, claim, cred, problem


async def test_claim_lifecycle(api: httpx.AsyncClient) -> None:
    created = await claim(api)
    assert created["pool"] == "p" and created["version"] == 1 and len(created["proxy_token"]) >= 32
    got = (await api.get("/v1/claims/c1")).json()
    assert "proxy_token" not in got and got["id"] == "c1"
    assert [c["id"] for c in (await api.get("/v1/claims")).json()] == ["c1"]
    rotated = (await api.post("/v1/claims/c1/token")).json()
    assert rotated["proxy_token"] != created["proxy_token"] and rotated["version"] == 2
    assert (await api.delete("/v1/claims/c1")).status_code == 204
    problem(await api.get("/v1/claims/c1"), 404, "not_found")


async def test_generated_claim_id(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/claims", json={"pool": "p"})
    assert r.status_code == 201 and r.json()["id"].startswith("claim-")


async def test_put_credential_creates_then_replaces_with_coverage_and_etag(api: httpx.AsyncClient) -> None:
    await claim(api)
    r = await cred(api)
    assert r.status_code == 201 and r.headers["etag"] == '"1"'
    body = r.json()
    assert body["placeholder"].startswith("surr_") and body["version"] == 1
    assert body["coverage"] == [
        {
            "host": "api.test",
            "rule": "p.egress[0] api.test",
            "header": "the placeholder's header, one of: Api-Key, Authorization, Ocp-Apim-Subscription-Key, "
            "Private-Token, X-Api-Key, X-Auth-Token, X-Goog-Api-Key",
        }
    ]
    r = await cred(
        api,
        {
            "hosts": ["x.github.test"],
            "value": SECRET + "2",
            "inject": {"set_header": "Authorization", "format": "token {value}"},
        },
    )
    assert r.status_code == 200 and r.headers["etag"] == '"2"'
    assert r.json()["placeholder"] == body["placeholder"]  # kept across a replace
    assert r.json()["coverage"][0] == {
        "host": "x.github.test",
        "rule": "p.egress[1] *.github.test",
        "header": "Authorization",
    }
    assert SECRET not in r.text


async def test_if_match_compare_and_set(api: httpx.AsyncClient) -> None:
    await claim(api)
    await cred(api)
    problem(await cred(api, headers={"If-Match": '"7"'}), 412, "version_mismatch")
    assert (await api.get("/v1/claims/c1/credentials/gh")).json()["version"] == 1  # nothing changed
    assert (await cred(api, headers={"If-Match": '"1"'})).headers["etag"] == '"2"'
    problem(await cred(api, headers={"If-Match": "2"}), 400, "invalid_if_match")
    assert (await cred(api, headers={"If-Match": "*"})).status_code == 200
    problem(await cred(api, name="absent", headers={"If-Match": "*"}), 412, "version_mismatch")
    r = await api.patch("/v1/claims/c1/credentials/gh", json={"value": "new"}, headers={"If-Match": '"1"'})
    problem(r, 412, "version_mismatch")
    r = await api.delete("/v1/claims/c1/credentials/gh", headers={"If-Match": '"1"'})
    problem(r, 412, "version_mismatch")


async def test_patch_credential(api: httpx.AsyncClient) -> None:
    await claim(api)
    await cred(api)
    r = await api.patch("/v1/claims/c1/credentials/gh", json={"value": SECRET + "rotated"})
    assert r.status_code == 200 and r.json()["version"] == 2 and r.headers["etag"] == '"2"'
    r = await api.patch(
        "/v1/claims/c1/credentials/gh",
        json={"expires_at": "2030-01-01T00:00:00Z", "inject": {"set_header": "X-Key"}},
    )
    assert (
        r.json()["expires_at"].startswith("2030-01-01") and r.json()["inject"]["format"] == "Bearer {value}"
    )
    r = await api.patch("/v1/claims/c1/credentials/gh", json={"expires_at": None, "inject": None})
    assert r.json()["expires_at"] is None and r.json()["inject"] is None
    problem(await api.patch("/v1/claims/c1/credentials/gh", json={"hosts": None}), 422, "invalid_request")
    problem(
        await api.patch("/v1/claims/c1/credentials/gh", json={"hosts": ["evil.test"]}),
        422,
        "host_not_covered",
    )
    problem(await api.patch("/v1/claims/c1/credentials/nope", json={"value": "x"}), 404, "not_found")


async def test_reads_never_return_a_value(api: httpx.AsyncClient) -> None:
    await claim(api)
    await cred(api)
    for path in ("/v1/claims/c1/credentials/gh", "/v1/claims/c1/credentials", "/v1/claims/c1", "/v1/claims"):
        r = await api.get(path)
        assert r.status_code == 200 and SECRET not in r.text and "value" not in r.text


async def test_health_metrics_and_openapi(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    await api.get("/v1/claims")
    metrics = (await api.get("/metrics")).text
    assert 'surrogate_control_requests_total{method="GET",status_class="2xx"}' in metrics
    spec = (await api.get("/openapi.json")).json()
    assert "/v1/claims/{claim}/credentials/{name}" in spec["paths"]


async def test_credential_slots_are_written_read_and_patched_back_to_the_default(
    api: httpx.AsyncClient, control: Control
) -> None:
    """Issue 13 class 4 through the control API: ``headers`` and ``basic_parts`` are stored, shown
    in reads and coverage, used by the proxy from the next request, and null is the default."""
    await claim(api)
    got = (await cred(api)).json()
    assert got["headers"] == ["Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key", "Private-Token",
                              "X-Auth-Token", "Ocp-Apim-Subscription-Key"]  # fmt: skip
    assert got["basic_parts"] == ["password"]
    body = {
        "hosts": ["api.test"],
        "value": SECRET,
        "headers": ["DD-API-KEY"],
        "basic_parts": ["user", "password"],
    }
    r = await cred(api, body)
    assert (r.json()["headers"], r.json()["basic_parts"]) == (["dd-api-key"], ["user", "password"])
    assert r.json()["coverage"][0]["header"] == "the placeholder's header, one of: dd-api-key"
    control.registry.refresh()
    c = control.registry.claim("c1")
    assert c is not None
    (credential,) = c.credentials
    assert credential.swaps_in_header(b"DD-Api-Key") and not credential.swaps_in_header(b"Authorization")
    r = await api.patch("/v1/claims/c1/credentials/gh", json={"headers": None, "basic_parts": None})
    assert (r.json()["headers"][0], r.json()["basic_parts"]) == ("Authorization", ["password"])
    for bad in ({"headers": ["Host"]}, {"headers": ["Proxy-Authorization"]}, {"headers": ["a b"]},
                {"basic_parts": ["realm"]}):  # fmt: skip
        r = await api.patch("/v1/claims/c1/credentials/gh", json=bad)
        assert r.status_code == 422, (bad, r.text)
