"""proxy.control.checks through the API: every kind of bad claim and credential write gets its
status, reason code and field, one row each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.control.api import make_app
from proxy.control.service import Control
from proxy.rules.loader import load_rules
from proxy.store.registry import Registry
from proxy.store.sqlite import Store
from unit.control.world import SECRET, claim, cred, problem


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
        (
            {"id": "x", "pool": "p", "sources": ["10.9.0.2/32"], "interface": "eth0; rm"},
            422,
            "invalid_interface",
            "interface",
        ),
        (
            {"id": "x", "pool": "p", "sources": ["10.9.0.2/32"], "interface": "a" * 16},
            422,
            "invalid_interface",
            "interface",
        ),
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


async def test_a_pool_that_allows_any_host_takes_no_credentials(api: httpx.AsyncClient) -> None:
    for cid, pool in (("w1", "wide"), ("w2", "wide-ok")):
        assert (await api.post("/v1/claims", json={"id": cid, "pool": pool})).status_code == 201
    problem(await cred(api, cid="w1"), 422, "any_host_pool")
    assert (await cred(api, cid="w2")).status_code == 201  # the pool says unsafe_any_host: true
    # ... to connect anywhere, never to send a secret anywhere (hostile review r1: it was 201)
    got = problem(await cred(api, {"hosts": ["*"], "value": SECRET}, cid="w2", name="any"), 422, "risky_host")
    assert got["field"] == "hosts[0]"


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
