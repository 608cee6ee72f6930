"""The control API, in process: a real app over a real store (temp SQLite + key file) and the
rules the proxy would load. Every status code and every kind of bad input, one row each."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from proxy import audit
from proxy.control.api import MAX_BODY, make_app
from proxy.control.apiedge import allowed_authorities, foreign_authority
from proxy.control.service import Control
from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store

SECRET = "CANARYapi-value-7f3e9c"
RULES = """\
version: 1
pools:
  p:
    egress:
      - host: api.test
      - host: "*.github.test"
      - host: opaque.test
        intercept: false
  wide:
    egress:
      - host: api.test
      - host: "*"
  wide-ok:
    unsafe_any_host: true
    egress:
      - host: api.test
      - host: "*"
claims:
  - id: static
    pool: p
    proxy_token: file:tok
"""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "store.sqlite3", KeyRing.load_or_create(tmp_path / "store.key"))
    yield s
    s.close()


@pytest.fixture
def control(tmp_path: Path, store: Store) -> Control:
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "tok").write_text("statictoken\n")
    return Control(Registry(load_rules(tmp_path / "rules.yaml"), store), store)


@pytest.fixture
async def api(control: Control) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=make_app(control))
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as client:
        yield client


async def claim(api: httpx.AsyncClient, cid: str = "c1") -> dict[str, Any]:
    r = await api.post("/v1/claims", json={"id": cid, "pool": "p"})
    assert r.status_code == 201, r.text
    return r.json()


async def cred(
    api: httpx.AsyncClient,
    body: dict[str, Any] | None = None,
    cid: str = "c1",
    name: str = "gh",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = body if body is not None else {"hosts": ["api.test"], "value": SECRET}
    return await api.put(f"/v1/claims/{cid}/credentials/{name}", json=body, headers=headers or {})


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and body["message"], body
    assert SECRET not in r.text
    return body


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


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"id": "x", "pool": "nope"}, 422, "unknown_pool", "pool"),
        ({"id": "bad id!", "pool": "p"}, 422, "invalid_id", "id"),
        ({"id": "static", "pool": "p"}, 409, "conflict", None),
        ({"id": "x", "pool": "p", "colour": "red"}, 422, "invalid_request", "colour"),
        ({"id": "x"}, 422, "invalid_request", "pool"),
        ({"id": "x", "pool": "p", "sources": ["not-an-address"]}, 422, "invalid_sources", "sources"),
        ({"id": 5, "pool": "p"}, 422, "invalid_request", "id"),
        ({"id": "x", "pool": "p", "sources": ["10.9.0.2/32"], "interface": "eth0; rm"}, 422,
         "invalid_interface", "interface"),
        ({"id": "x", "pool": "p", "sources": ["10.9.0.2/32"], "interface": "a" * 16}, 422,
         "invalid_interface", "interface"),
        ({"id": "x", "pool": "p", "interface": "veth-sbx"}, 422, "invalid_interface", "interface"),
    ],
    ids=[
        "unknown-pool",
        "bad-id",
        "rules-file-id",
        "unknown-field",
        "missing-pool",
        "bad-source",
        "id-not-string",
        "interface-not-a-name",
        "interface-too-long",
        "interface-without-sources",
    ],
)
async def test_create_claim_refusals(
    api: httpx.AsyncClient, body: dict[str, Any], status: int, code: str, field: str | None
) -> None:
    assert problem(await api.post("/v1/claims", json=body), status, code)["field"] == field


async def test_a_claim_bound_to_an_interface_keeps_it(api: httpx.AsyncClient, control: Control) -> None:
    """Issue 21: control-API claims can be bound to their arrival interface, like rules-file ones
    (addons/fence.py refuses their connections from any other interface)."""
    body = {"id": "tb", "pool": "p", "sources": ["10.9.0.2/32"], "interface": "veth-tb"}
    made = await api.post("/v1/claims", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["interface"] == "veth-tb"
    assert (await api.get("/v1/claims/tb")).json()["interface"] == "veth-tb"
    plain = await claim(api, "tc")
    assert plain["interface"] is None
    control.registry.refresh()
    bound = control.registry.claim("tb")
    assert bound is not None and bound.interface == "veth-tb"
    assert control.registry.claim("tc").interface is None  # type: ignore[union-attr]


async def test_duplicate_claim_is_a_conflict(api: httpx.AsyncClient) -> None:
    await claim(api)
    problem(await api.post("/v1/claims", json={"id": "c1", "pool": "p"}), 409, "conflict")


async def test_a_source_network_identifies_one_claim_only(api: httpx.AsyncClient) -> None:
    """Regression: two claims could both hold 10.0.0.0/8 (the rules file refuses that)."""
    made = await api.post("/v1/claims", json={"id": "x5", "pool": "p", "sources": ["10.0.0.0/8"]})
    assert made.status_code == 201
    found = problem(
        await api.post("/v1/claims", json={"id": "x6", "pool": "p", "sources": ["10.0.0.1/8"]}),
        409,
        "source_taken",
    )
    assert found["field"] == "sources" and "'x5'" in found["message"]
    problem(await api.get("/v1/claims/x6"), 404, "not_found")
    narrower = await api.post("/v1/claims", json={"id": "x7", "pool": "p", "sources": ["10.1.0.0/16"]})
    assert narrower.status_code == 201  # a narrower network is another source: the longest prefix wins


async def test_malformed_json_and_oversize_body(api: httpx.AsyncClient) -> None:
    r = await api.post(
        "/v1/claims", content=b'{"id": "x", "pool": ', headers={"content-type": "application/json"}
    )
    problem(r, 400, "malformed_json")
    big = json.dumps({"id": "x", "pool": "p", "sources": ["1.2.3.4"] * (MAX_BODY // 8)})
    problem(
        await api.post("/v1/claims", content=big, headers={"content-type": "application/json"}),
        413,
        "body_too_large",
    )


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


@pytest.mark.parametrize(
    ("body", "code", "field", "says"),
    [
        ({"hosts": ["other.test"], "value": SECRET}, "host_not_covered", "hosts[0]", "other.test"),
        ({"hosts": ["opaque.test"], "value": SECRET}, "host_not_covered", "hosts[0]", "opaque.test"),
        ({"hosts": ["api.test", "a.*.test"], "value": SECRET}, "invalid_host", "hosts[1]", "a.*.test"),
        ({"hosts": [], "value": SECRET}, "invalid_request", "hosts", "hosts"),
        ({"hosts": ["api.test"], "value": SECRET + "\r\nX-Evil: 1"}, "invalid_value", "value", "control"),
        ({"hosts": ["api.test"], "value": "x" * 20000}, "invalid_value", "value", "16384"),
        ({"hosts": ["api.test"], "value": ""}, "invalid_request", "value", "value"),
        (
            {"hosts": ["api.test"], "value": SECRET, "placeholder": "nope"},
            "invalid_placeholder",
            "placeholder",
            "surr_",
        ),
        (
            {"hosts": ["api.test"], "value": SECRET, "inject": {"set_header": "Proxy-Authorization"}},
            "invalid_inject",
            "inject.set_header",
            "Proxy-Authorization",
        ),
        (
            {"hosts": ["api.test"], "value": SECRET, "inject": {"set_header": "X-K", "format": "no value"}},
            "invalid_inject",
            "inject.format",
            "{value}",
        ),
        (
            {"hosts": ["api.test"], "value": SECRET, "expires_at": "2026-01-01T00:00:00"},
            "invalid_request",
            "expires_at",
            "timezone",
        ),
        ({"hosts": ["api.test"]}, "invalid_request", "value", "value"),
        ({"hosts": ["api.test"], "value": SECRET, "secret": "x"}, "invalid_request", "secret", "unknown"),
        # regressions: each was a 500 with a traceback (and the second stored an unreadable row)
        (
            {"hosts": ["api.test"], "value": SECRET, "max_requests": 99999999999999999999},
            "invalid_request",
            "max_requests",
            "max_requests",
        ),
        (
            {"hosts": ["api.test"], "value": SECRET, "expires_at": "0001-01-01T00:00:00+14:00"},
            "invalid_request",
            "expires_at",
            "1970",
        ),
        (
            {"hosts": ["api.test"], "value": SECRET, "expires_at": "9999-12-31T23:59:59-14:00"},
            "invalid_request",
            "expires_at",
            "9998",
        ),
    ],
    ids=[
        "uncovered-host",
        "host-only-opaque",
        "bad-host-pattern",
        "no-hosts",
        "value-with-crlf",
        "value-too-long",
        "empty-value",
        "bad-placeholder",
        "inject-proxy-header",
        "inject-format-without-value",
        "naive-expiry",
        "missing-value",
        "unknown-field",
        "budget-past-64-bits",
        "expiry-before-year-1-utc",
        "expiry-past-year-9999-utc",
    ],
)
async def test_put_credential_refusals(
    api: httpx.AsyncClient, body: dict[str, Any], code: str, field: str, says: str
) -> None:
    await claim(api)
    found = problem(await cred(api, body), 422, code)
    assert found["field"] == field and says in found["message"]
    problem(await api.get("/v1/claims/c1/credentials/gh"), 404, "not_found")  # nothing stored


async def test_put_to_unknown_claim_and_duplicate_placeholder(api: httpx.AsyncClient) -> None:
    problem(await cred(api, cid="ghost"), 404, "not_found")
    await claim(api)
    await claim(api, "c2")
    ph = (await cred(api)).json()["placeholder"]
    body = {"hosts": ["api.test"], "value": SECRET, "placeholder": ph}
    problem(await cred(api, body, cid="c2"), 409, "conflict")


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


async def test_a_pool_that_allows_any_host_takes_no_credentials(api: httpx.AsyncClient) -> None:
    for cid, pool in (("w1", "wide"), ("w2", "wide-ok")):
        assert (await api.post("/v1/claims", json={"id": cid, "pool": pool})).status_code == 201
    problem(await cred(api, cid="w1"), 422, "any_host_pool")
    assert (await cred(api, cid="w2")).status_code == 201  # the pool says unsafe_any_host: true
    # ... to connect anywhere, never to send a secret anywhere (hostile review r1: it was 201)
    got = problem(await cred(api, {"hosts": ["*"], "value": SECRET}, cid="w2", name="any"), 422, "risky_host")
    assert got["field"] == "hosts[0]"


async def test_reads_never_return_a_value(api: httpx.AsyncClient) -> None:
    await claim(api)
    await cred(api)
    for path in ("/v1/claims/c1/credentials/gh", "/v1/claims/c1/credentials", "/v1/claims/c1", "/v1/claims"):
        r = await api.get(path)
        assert r.status_code == 200 and SECRET not in r.text and "value" not in r.text


async def test_delete_credential_and_claim_cascade(api: httpx.AsyncClient, store: Store) -> None:
    await claim(api)
    await cred(api)
    assert (await api.delete("/v1/claims/c1/credentials/gh")).status_code == 204
    problem(await api.delete("/v1/claims/c1/credentials/gh"), 404, "not_found")
    await cred(api)
    assert (await api.delete("/v1/claims/c1")).status_code == 204
    assert store.snapshot() == ([], [])
    problem(await api.delete("/v1/claims/c1"), 404, "not_found")


async def test_unknown_route_and_method(api: httpx.AsyncClient) -> None:
    problem(await api.get("/v1/nothing"), 404, "not_found")
    problem(await api.post("/v1/claims/c1"), 405, "method_not_allowed")


async def test_health_metrics_and_openapi(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    await api.get("/v1/claims")
    metrics = (await api.get("/metrics")).text
    assert 'surrogate_control_requests_total{method="GET",status_class="2xx"}' in metrics
    spec = (await api.get("/openapi.json")).json()
    assert "/v1/claims/{claim}/credentials/{name}" in spec["paths"]


async def test_tcp_listener_requires_the_operator_token(control: Control) -> None:
    app = make_app(control, operator_token="operator-token-0123456789", listen=("127.0.0.1", 9090))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:9090"
    ) as tcp:
        problem(await tcp.get("/v1/claims"), 401, "unauthorized")
        problem(await tcp.get("/v1/claims", headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
        ok = await tcp.get("/v1/claims", headers={"Authorization": "Bearer operator-token-0123456789"})
        assert ok.status_code == 200
        assert (await tcp.get("/healthz")).status_code == 200  # liveness needs no token


async def test_every_mutation_writes_a_control_audit_event_without_the_value(api: httpx.AsyncClient) -> None:
    with capture_logs() as logs:
        await claim(api)
        await cred(api)
        await api.patch("/v1/claims/c1/credentials/gh", json={"value": SECRET + "2"})
        await api.delete("/v1/claims/c1/credentials/gh")
        await api.post("/v1/claims/c1/token")
        await api.delete("/v1/claims/c1")
    events = [
        (e[audit.ACTION], e[audit.CREDENTIAL], e[audit.OLD_VERSION], e[audit.NEW_VERSION])
        for e in logs
        if e["event"] == "control"
    ]
    assert events == [
        ("claim.create", None, None, 1),
        ("credential.put", "gh", None, 1),
        ("credential.patch", "gh", 1, 2),
        ("credential.delete", "gh", 2, None),
        ("claim.rotate_token", None, 1, 2),
        ("claim.delete", None, 2, None),
    ]
    assert all(e[audit.WHO] == "socket" for e in logs)
    assert SECRET not in repr(logs)


async def test_a_failing_handler_gives_a_counted_json_500_without_its_message(
    api: httpx.AsyncClient,
    control: Control,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: an unexpected exception was Starlette's plain-text 500, missing from
    surrogate_control_requests_total, and its message and traceback went to stderr (a message may
    quote a value the request carried)."""

    def boom() -> None:
        raise RuntimeError(f"failed on {SECRET}")

    monkeypatch.setattr(control, "list_claims", boom)
    body = problem(await api.get("/v1/claims"), 500, "internal_error")
    assert SECRET not in body["message"]
    assert "RuntimeError" in caplog.text and SECRET not in caplog.text
    metrics = (await api.get("/metrics")).text
    assert 'surrogate_control_requests_total{method="GET",status_class="5xx"} 1.0' in metrics


# -- issue 20 item 8: edges ---------------------------------------------------------------------


async def test_a_chunked_body_over_the_limit_is_413(api: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"id": "x", "pool": "p", "sources": ['
        for _ in range(MAX_BODY // 990 + 2):  # 990 bytes each: past MAX_BODY
            yield b'"1.2.3.4", ' * 90
        yield b'"1.2.3.4"]}'

    r = await api.post("/v1/claims", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers  # sent chunked
    problem(r, 413, "body_too_large")


async def test_a_chunked_body_under_the_limit_is_read(api: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"id": "chunked", '
        yield b'"pool": "p"}'

    r = await api.post("/v1/claims", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", "/v1/claims/a%2Fb", "claim"),
        ("GET", "/v1/claims/a%2fb", "claim"),
        ("DELETE", "/v1/claims/a%2Fb", "claim"),
        ("POST", "/v1/claims/c1%2Ftoken", "claim"),  # decoded, it would rotate c1's token
        ("GET", "/v1/claims/c1%2Fcredentials", "claim"),
        ("PUT", "/v1/claims/c1%2Fcredentials%2Fgh", "claim"),
        ("PUT", "/v1/claims/c1/credentials/a%2Fb", "name"),
        ("GET", "/v1/claims/c1/credentials/a%2F..%2Fgh", "name"),
        ("GET", "/v1/claims/a/b", "claim"),
        ("DELETE", "/v1/claims/a/b", "claim"),
        ("POST", "/v1/claims/a/b/token", "claim"),
        ("GET", "/v1/claims/a/b/credentials", "claim"),
        ("PUT", "/v1/claims/a/b/credentials/gh", "claim"),
        ("PUT", "/v1/claims/c1/credentials/a/b", "name"),
        ("DELETE", "/v1/claims/c1/credentials/a/b", "name"),
    ],
)
async def test_a_slash_in_a_claim_id_or_credential_name_is_a_422_naming_the_field(
    api: httpx.AsyncClient, method: str, path: str, field: str
) -> None:
    await claim(api)
    body = {"hosts": ["api.test"], "value": SECRET} if method == "PUT" else None
    r = await api.request(method, httpx.URL("http://control" + path), json=body)
    got = problem(r, 422, "invalid_id" if field == "claim" else "invalid_name")
    assert got["field"] == field and "'/'" in got["message"]
    assert (await api.get("/v1/claims/c1/credentials")).json() == []  # nothing was written


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 200),
        ({"Host": "localhost:9090"}, 200),
        ({"Origin": "http://127.0.0.1:9090"}, 200),
        ({"Host": "evil.test:9090"}, 403),  # DNS rebinding: the page's own name
        ({"Host": "127.0.0.1:9091"}, 403),
        ({"Host": "127.0.0.1"}, 403),
        ({"Host": "127.0.0.1.evil.test:9090"}, 403),
        ({"Origin": "http://evil.test:9090"}, 403),
        ({"Origin": "null"}, 403),
        ({"Origin": "https://127.0.0.1:9090"}, 403),
        ({"Host": "evil.test:9090", "Origin": "http://evil.test:9090"}, 403),
    ],
    ids=lambda v: str(v),
)
async def test_the_tcp_listener_answers_only_its_own_host_and_origin(
    control: Control, headers: dict[str, str], status: int
) -> None:
    app = make_app(control, operator_token="operator-token-0123456789", listen=("127.0.0.1", 9090))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090") as tcp:
        for path in ("/v1/claims", "/healthz"):
            r = await tcp.get(path, headers={"Authorization": "Bearer operator-token-0123456789", **headers})
            assert r.status_code == status, (path, r.text)
            if status == 403:
                assert r.json()["error"] == "foreign_host"


def test_a_tcp_listener_without_its_address_is_refused(control: Control) -> None:
    with pytest.raises(ValueError, match="Host check"):
        make_app(control, operator_token="operator-token-0123456789")


@pytest.mark.parametrize("host", ["*.herokuapp.com", "*.on.aws", "аpi.github.test", "api.\u0261ithub.test"])
async def test_a_credential_host_that_looks_safe_and_is_not_is_a_422(
    tmp_path: Path, store: Store, host: str
) -> None:
    """The same hosts `rules check` refuses (issue 13 class 9), written through the API."""
    (tmp_path / "rules.yaml").write_text(
        "version: 1\npools:\n  p:\n    egress:\n"
        '      - host: "*.herokuapp.com"\n      - host: "*.on.aws"\n      - host: "*.github.test"\n'
    )
    control = Control(Registry(load_rules(tmp_path / "rules.yaml"), store), store)
    transport = httpx.ASGITransport(app=make_app(control))
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as api:
        await claim(api)
        got = problem(await cred(api, {"hosts": [host], "value": SECRET}), 422, "risky_host")
    assert got["field"] == "hosts[0]"


@pytest.mark.parametrize(
    ("listen", "host", "ok"),
    [
        (("::1", 9), "[::1]:9", True),
        (("::1", 9), "localhost:9", True),
        (("::1", 9), "127.0.0.1:9", False),
        (("localhost", 9), "127.0.0.1:9", True),
        (("localhost", 9), "[::1]:9", True),
        (("localhost", 9), "evil.test:9", False),
    ],
)
def test_the_authorities_a_listener_answers(listen: tuple[str, int], host: str, ok: bool) -> None:
    assert (foreign_authority(host, None, allowed_authorities(*listen)) is None) is ok
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
