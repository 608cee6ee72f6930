"""proxy.control.service through the API: what a write does to the store and the registry, the
conflicts it refuses, the audit event of every mutation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from proxy import audit
from proxy.control.service import Control
from proxy.core import placeholders, templates
from proxy.store.sqlite import Store
from unit.control.world import SECRET, claim, cred, problem


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


async def test_put_to_unknown_claim_and_duplicate_placeholder(api: httpx.AsyncClient) -> None:
    problem(await cred(api, cid="ghost"), 404, "not_found")
    await claim(api)
    await claim(api, "c2")
    ph = (await cred(api)).json()["placeholder"]
    body = {"hosts": ["api.test"], "value": SECRET, "placeholder": ph}
    problem(await cred(api, body, cid="c2"), 409, "conflict")


async def test_delete_credential_and_claim_cascade(api: httpx.AsyncClient, store: Store) -> None:
    await claim(api)
    await cred(api)
    assert (await api.delete("/v1/claims/c1/credentials/gh")).status_code == 204
    problem(await api.delete("/v1/claims/c1/credentials/gh"), 404, "not_found")
    await cred(api)
    assert (await api.delete("/v1/claims/c1")).status_code == 204
    assert store.snapshot() == ([], [])
    problem(await api.delete("/v1/claims/c1"), 404, "not_found")


RULES_FILE_CLAIM_ROUTES = [
    ("GET", "/v1/claims/static", None, {}),
    ("DELETE", "/v1/claims/static", None, {}),
    ("POST", "/v1/claims/static/token", None, {}),
    ("GET", "/v1/claims/static/credentials", None, {}),
    ("PUT", "/v1/claims/static/credentials/gh", {"hosts": ["api.test"], "value": SECRET}, {}),
    ("PUT", "/v1/claims/static/credentials/gh", {"hosts": ["api.test"], "value": SECRET}, {"If-Match": "*"}),
    ("PATCH", "/v1/claims/static/credentials/gh", {"hosts": ["api.test"]}, {}),
    ("GET", "/v1/claims/static/credentials/gh", None, {}),
    ("DELETE", "/v1/claims/static/credentials/gh", None, {}),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    RULES_FILE_CLAIM_ROUTES,
    ids=[
        "get",
        "delete",
        "rotate-token",
        "list-creds",
        "put",
        "put-if-match-any",
        "patch",
        "get-cred",
        "delete-cred",
    ],
)
async def test_every_claim_route_on_a_rules_file_claim_says_where_its_credentials_belong(
    api: httpx.AsyncClient,
    store: Store,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
) -> None:
    """issue 18 item 4: `creds put` on a claim of the rules file answered `404: no claim 'static'`.
    Every claim route says the claim is the rules file's and how to get a control-API one."""
    found = problem(await api.request(method, path, json=body, headers=headers), 409, "rules_file_claim")
    assert found["message"] == (
        "claim 'static' is declared in the rules file, and the control API holds only the claims it "
        "created: declare its credentials in the rules file (then reload), or create a control-API "
        "claim (surrogate claims create --pool p --id ID; POST /v1/claims) and put them there"
    )
    assert store.get_claim("static") is None and store.list_claims() == []  # nothing written


async def test_an_unknown_claim_is_still_not_found(api: httpx.AsyncClient) -> None:
    for method, path, body, headers in RULES_FILE_CLAIM_ROUTES:
        r = await api.request(method, path.replace("static", "ghost"), json=body, headers=headers)
        assert problem(r, 404, "not_found")["message"] == "no claim 'ghost'"


# -- placeholder templates (issue 15): minted on PUT ------------------------------------------


async def test_a_put_with_a_placeholder_template_mints_one_of_its_shape_and_keeps_it(
    api: httpx.AsyncClient, control: Control
) -> None:
    await claim(api)
    body = {"hosts": ["api.test"], "value": SECRET, "placeholder_template": "github_classic"}
    made = await cred(api, body)
    assert made.status_code == 201, made.text
    ph = made.json()["placeholder"]
    assert placeholders.template_of(ph) is templates.SHIPPED["github_classic"]
    assert placeholders.has_valid_checksum(ph)
    again = await cred(api, body)  # a PUT that repeats itself keeps the sandbox's placeholder
    assert again.status_code == 200 and again.json()["placeholder"] == ph
    other = await cred(api, {**body, "placeholder_template": "openai"})  # another template: a new one
    assert other.status_code == 200
    assert placeholders.template_of(other.json()["placeholder"]) is templates.SHIPPED["openai"]
    control.registry.refresh()
    assert control.registry.claim("c1") is not None


async def test_a_put_with_a_placeholder_of_its_template_keeps_it(api: httpx.AsyncClient) -> None:
    await claim(api)
    ph = templates.mint(templates.SHIPPED["anthropic"])
    body = {"hosts": ["api.test"], "value": SECRET, "placeholder": ph, "placeholder_template": "anthropic"}
    made = await cred(api, body)
    assert made.status_code == 201 and made.json()["placeholder"] == ph, made.text
    # and a template-shaped placeholder without the template field is accepted as written
    plain = templates.mint(templates.SHIPPED["aws_access_key_id"])
    put = await cred(api, {"hosts": ["api.test"], "value": SECRET, "placeholder": plain}, name="aws")
    assert put.status_code == 201 and put.json()["placeholder"] == plain, put.text


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"placeholder_template": "no-such-provider"}, "invalid_placeholder_template"),
        ({"placeholder_template": "openai", "placeholder": "surr_" + "A1" * 12}, "invalid_placeholder"),
        ({"placeholder_template": "github_classic", "placeholder": "ghp_" + "A" * 35}, "invalid_placeholder"),
        ({"placeholder": "ghp_" + "A" * 37}, "invalid_placeholder"),
    ],
    ids=["unknown-template", "surr-for-template", "short-ghp", "long-ghp-no-template"],
)
async def test_a_put_whose_placeholder_does_not_fit_is_refused(
    api: httpx.AsyncClient, extra: dict[str, str], code: str
) -> None:
    await claim(api)
    problem(await cred(api, {"hosts": ["api.test"], "value": SECRET, **extra}), 422, code)
