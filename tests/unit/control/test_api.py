"""proxy.control.api, in process: the app of one listener (the operator token, the Host and
Origin guard, the body limit, the shapes of errors, unknown routes and methods, a failing
handler). The fixtures (tests/unit/control/conftest.py) are a real app over a real store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from proxy.control.api import MAX_BODY, make_app
from proxy.control.service import Control
from unit.control.world import SECRET, claim, problem


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


async def test_unknown_route_and_method(api: httpx.AsyncClient) -> None:
    problem(await api.get("/v1/nothing"), 404, "not_found")
    problem(await api.post("/v1/claims/c1"), 405, "method_not_allowed")


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
        ({"Origin": "https://127.0.0.1:9090"}, 403),  # a plain listener's origin is http only
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


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        # A browser on the page of a TLS listener sends its own https origin on POST (RFC 6454 §7):
        # that one is the listener itself and must be served, else the page breaks over TLS.
        ("https://127.0.0.1:9090", 200),
        ("https://localhost:9090", 200),
        ("HTTPS://127.0.0.1:9090", 200),
        ("http://127.0.0.1:9090", 403),  # not the TLS listener's scheme
        ("https://127.0.0.1:9091", 403),
        ("https://evil.test:9090", 403),
        ("https://127.0.0.1:9090/ui/", 403),
        ("null", 403),
        ("wss://127.0.0.1:9090", 403),
    ],
)
async def test_a_tls_listener_accepts_exactly_its_own_https_origin(
    control: Control, origin: str, status: int
) -> None:
    app = make_app(control, operator_token="operator-token-0123456789", listen=("127.0.0.1", 9090), tls=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9090") as tcp:
        r = await tcp.get(
            "/v1/claims", headers={"Authorization": "Bearer operator-token-0123456789", "Origin": origin}
        )
        assert r.status_code == status, (origin, r.text)
        if status == 403:
            assert r.json()["error"] == "foreign_host"


def test_a_tcp_listener_without_its_address_is_refused(control: Control) -> None:
    with pytest.raises(ValueError, match="Host check"):
        make_app(control, operator_token="operator-token-0123456789")
