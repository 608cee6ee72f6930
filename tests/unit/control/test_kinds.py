"""Credential kinds through the control API (issue 15, proxy/control/kinds.py): a PUT of kind
aws_sigv4, oauth_client and hmac is checked field by field, its secrets are sealed in the store
(the value, and the refresh token apart), GET shows the kind's block without a secret, and every
refusal names the field and never echoes a secret. Real app, real store (conftest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.control.service import Control
from proxy.core import templates
from proxy.store.registry import Registry
from proxy.store.sqlite import Store
from unit.control.world import SECRET, claim, cred

AKID = "AKIA" + "CANARYAKID0123"
AWS_SECRET = SECRET + "-aws"
AWS_TOKEN = SECRET + "-token"
REFRESH = SECRET + "-refresh"
SECRETS = (SECRET, AWS_SECRET, AWS_TOKEN, REFRESH, AKID)


def aws(**extra: Any) -> dict[str, Any]:
    block = {"access_key_id": AKID, "secret_access_key": AWS_SECRET, "session_token": AWS_TOKEN,
             "regions": ["us-east-1"], "services": ["s3"], **extra}  # fmt: skip
    return {"hosts": ["api.test"], "kind": "aws_sigv4", "aws_sigv4": block}


def oauth(**extra: Any) -> dict[str, Any]:
    block = {"token_url": "https://api.test/token", "client_id": "client-1", **extra}
    return {"hosts": ["api.test"], "kind": "oauth_client", "value": SECRET, "mint": block}


def hmac(**extra: Any) -> dict[str, Any]:
    return {"hosts": ["api.test"], "kind": "hmac", "value": SECRET, "sign": {"header": "X-Sig", **extra}}


def no_secret(r: httpx.Response) -> None:
    for s in SECRETS:
        assert s not in r.text, s


async def test_aws_sigv4_put_seals_the_keys_and_get_shows_only_placeholders(
    api: httpx.AsyncClient, store: Store, control: Control
) -> None:
    await claim(api)
    r = await cred(api, aws(), name="aws")
    assert r.status_code == 201, r.text
    no_secret(r)
    body = r.json()
    assert body["kind"] == "aws_sigv4" and body["mint"] is None and body["sign"] is None
    block = body["aws_sigv4"]
    assert block["regions"] == ["us-east-1"] and block["services"] == ["s3"]
    assert block["secret_placeholder"].startswith("surr_") and block["session_token_placeholder"]
    got = await api.get("/v1/claims/c1/credentials/aws")
    no_secret(got)
    assert got.json()["aws_sigv4"] == block
    value, _ = store.secret("c1", "aws")
    assert json.loads(value) == {
        "access_key_id": AKID,
        "secret_access_key": AWS_SECRET,
        "session_token": AWS_TOKEN,
    }
    registry = Registry(control.registry.policy, store)
    registry.refresh()
    c = registry.claim("c1")
    assert c is not None
    built = next(x for x in c.credentials if x.name == "aws")
    assert built.kind == "aws_sigv4" and built.sigv4 is not None and built.inject is None
    assert not built.surfaces
    assert built.sigv4.placeholder_secret == block["secret_placeholder"]


async def test_oauth_client_refresh_token_is_sealed_apart_and_never_shown(
    api: httpx.AsyncClient, store: Store, control: Control
) -> None:
    await claim(api)
    r = await cred(api, oauth(grant="refresh_token", refresh_token=REFRESH, scopes=["read"]), name="o")
    assert r.status_code == 201, r.text
    no_secret(r)
    assert r.json()["mint"]["grant"] == "refresh_token" and "refresh_token" not in r.json()["mint"]
    assert store.refresh_token("c1", "o") == REFRESH.encode()
    assert store.secret("c1", "o")[0] == SECRET.encode()
    registry = Registry(control.registry.policy, store)
    registry.refresh()
    c = registry.claim("c1")
    assert c is not None
    built = next(x for x in c.credentials if x.name == "o")
    assert built.mint is not None and built.inject is not None and built.inject.header == "Authorization"
    assert built.mint.refresh_token() is not None and built.mint.refresh_token().reveal() == REFRESH  # type: ignore[union-attr]


async def test_a_rotated_refresh_token_survives_a_new_registry_and_key_rotation(
    api: httpx.AsyncClient, store: Store, control: Control, tmp_path: Path
) -> None:
    """Regression (issue 15): a rotated refresh token lived in memory only; a restart used the
    first one, which the authorization server had already invalidated."""
    from proxy.core.secrets import Secret

    await claim(api)
    await cred(api, oauth(grant="refresh_token", refresh_token=REFRESH), name="o")
    registry = Registry(control.registry.policy, store)
    registry.refresh()
    built = next(x for x in registry.claim("c1").credentials if x.name == "o")  # type: ignore[union-attr]
    assert built.mint is not None and built.mint.kept is not None
    built.mint.kept.keep(Secret(REFRESH + "-2"))
    store.rotate_keys()
    again = Registry(control.registry.policy, store)  # a restart
    again.refresh()
    fresh = next(x for x in again.claim("c1").credentials if x.name == "o")  # type: ignore[union-attr]
    assert fresh.mint is not None and fresh.mint.refresh_token().reveal() == REFRESH + "-2"  # type: ignore[union-attr]
    raw = (tmp_path / "store.sqlite3").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("store.sqlite3-*")
    )
    for s in SECRETS:
        assert s.encode() not in raw


async def test_hmac_put_and_get(api: httpx.AsyncClient) -> None:
    await claim(api)
    r = await cred(api, hmac(parts=["timestamp", "method", "path"]), name="h")
    assert r.status_code == 201, r.text
    no_secret(r)
    assert r.json()["kind"] == "hmac" and r.json()["sign"]["header"] == "X-Sig"
    assert r.json()["sign"]["parts"] == ["timestamp", "method", "path"]


async def test_hmac_without_a_sign_block_takes_the_example_scheme_as_a_rules_file_does(
    api: httpx.AsyncClient,
) -> None:
    """A newcomer's PUT without ``sign`` was refused though rules/README.md says it defaults."""
    await claim(api)
    r = await cred(api, {"hosts": ["api.test"], "kind": "hmac", "value": SECRET}, name="h0")
    assert r.status_code == 201, r.text
    no_secret(r)
    assert r.json()["sign"]["header"] == "X-Signature"


REFUSALS = [
    ("aws-value", aws() | {"value": SECRET}, "value"),
    ("aws-no-block", {"hosts": ["api.test"], "kind": "aws_sigv4"}, "aws_sigv4"),
    ("aws-inject", aws() | {"inject": {"set_header": "X-K"}}, "inject"),
    ("aws-surfaces", aws() | {"surfaces": ["header"]}, "surfaces"),
    ("aws-bad-secret", aws(secret_access_key=SECRET + " with space"), "aws_sigv4.secret_access_key"),
    ("aws-no-region", aws(regions=[]), "aws_sigv4.regions"),
    ("aws-bad-region", aws(regions=["US East"]), "aws_sigv4.regions.0"),
    ("aws-unknown-field", aws(secret=SECRET), "aws_sigv4.secret"),
    (
        "aws-same-placeholders",
        aws(secret_placeholder="surr_SamePlaceholder00000001")
        | {"placeholder": "surr_SamePlaceholder00000001"},
        "aws_sigv4.secret_placeholder",
    ),
    ("aws-short-placeholder", aws(secret_placeholder="surr_" + "A" * 15), "aws_sigv4.secret_placeholder"),
    (
        "aws-token-placeholder-shape",
        aws(session_token_placeholder="ghp_" + "A" * 35),
        "aws_sigv4.session_token_placeholder",
    ),
    ("mint-on-static", {"hosts": ["api.test"], "value": SECRET, "mint": oauth()["mint"]}, "mint"),
    ("sign-on-oauth", oauth() | {"sign": {}}, "sign"),
    ("oauth-no-value", {k: v for k, v in oauth().items() if k != "value"}, "value"),
    ("oauth-http-url", oauth(token_url="http://api.test/token"), "mint.token_url"),
    ("oauth-unbound-endpoint", oauth(token_url="https://auth.elsewhere.test/token"), "mint.token_url"),
    ("oauth-refresh-missing", oauth(grant="refresh_token"), "mint.refresh_token"),
    ("oauth-refresh-not-for-grant", oauth(refresh_token=REFRESH), "mint.refresh_token"),
    (
        "oauth-refresh-control",
        oauth(grant="refresh_token", refresh_token=REFRESH + "\r\n"),
        "mint.refresh_token",
    ),
    ("oauth-bad-grant", oauth(grant="password"), "mint.grant"),
    ("oauth-bad-scope", oauth(scopes=["a b"]), "mint.scopes"),
    ("oauth-jwt-not-a-key", oauth(grant="jwt_bearer"), "value"),
    ("oauth-jwt-secret-auth", oauth(grant="jwt_bearer", client_auth="secret_basic"), "mint.client_auth"),
    ("oauth-capture", oauth() | {"oauth": {"token_endpoint": {"host": "api.test", "path": "/t"}}}, "oauth"),
    ("hmac-inject", hmac() | {"inject": {"set_header": "X-K"}}, "inject"),
    ("hmac-host-header", hmac(header="Host"), "sign.header"),
    ("hmac-bad-part", hmac(parts=["cookie"]), "sign.parts.0"),
    ("hmac-no-format", hmac(format="sig"), "sign.format"),
    ("hmac-value-control", hmac() | {"value": SECRET + "\n\r"}, "value"),
    ("unknown-kind", {"hosts": ["api.test"], "kind": "kerberos", "value": SECRET}, "kind"),
]


@pytest.mark.parametrize(("body", "field"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
async def test_a_bad_kind_block_is_refused_naming_the_field_never_a_secret(
    api: httpx.AsyncClient, store: Store, body: dict[str, Any], field: str
) -> None:
    await claim(api)
    r = await cred(api, body, name="k")
    assert r.status_code == 422, r.text
    no_secret(r)
    assert r.json()["field"] == field, r.json()
    assert store.get_credential("c1", "k") is None


PATCHES = [
    ("aws-value", aws(), {"value": SECRET}, "value"),
    ("aws-inject", aws(), {"inject": {"set_header": "X-K"}}, "inject"),
    ("aws-surfaces", aws(), {"surfaces": ["header"]}, "surfaces"),
    ("hmac-inject", hmac(), {"inject": {"set_header": "X-K"}}, "inject"),
    (
        "oauth-hosts-lose-endpoint",
        oauth() | {"hosts": ["api.test", "x.github.test"]},
        {"hosts": ["x.github.test"]},
        "hosts",
    ),
    ("kind", hmac(), {"kind": "static"}, "kind"),
]


@pytest.mark.parametrize(("put", "patch", "field"), [p[1:] for p in PATCHES], ids=[p[0] for p in PATCHES])
async def test_a_patch_keeps_to_what_the_kind_allows(
    api: httpx.AsyncClient, put: dict[str, Any], patch: dict[str, Any], field: str
) -> None:
    await claim(api)
    assert (await cred(api, put, name="k")).status_code == 201
    r = await api.patch("/v1/claims/c1/credentials/k", json=patch)
    assert r.status_code == 422, r.text
    no_secret(r)
    assert r.json()["field"] == field


async def test_a_patch_rotates_an_hmac_secret_and_keeps_the_kind(
    api: httpx.AsyncClient, store: Store
) -> None:
    await claim(api)
    await cred(api, hmac(), name="h")
    r = await api.patch("/v1/claims/c1/credentials/h", json={"value": SECRET + "-2"})
    assert r.status_code == 200, r.text
    assert r.json()["kind"] == "hmac" and r.json()["version"] == 2
    assert store.secret("c1", "h")[0] == (SECRET + "-2").encode()


async def test_a_put_of_another_kind_replaces_the_kind_and_clears_the_refresh_token(
    api: httpx.AsyncClient, store: Store
) -> None:
    await claim(api)
    await cred(api, oauth(grant="refresh_token", refresh_token=REFRESH), name="o")
    r = await cred(api, {"hosts": ["api.test"], "value": SECRET}, name="o")
    assert r.status_code == 200 and r.json()["kind"] == "static" and r.json()["mint"] is None
    assert store.refresh_token("c1", "o") is None
    assert store.get_credential("c1", "o").kind == "static"  # type: ignore[union-attr]


async def test_a_pem_private_key_may_keep_its_line_breaks(api: httpx.AsyncClient, store: Store) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    await claim(api)
    r = await cred(api, oauth(grant="jwt_bearer") | {"value": pem}, name="j")
    assert r.status_code == 201, r.text
    assert "PRIVATE KEY" not in r.text
    assert b"\n" not in store.secret("c1", "j")[0]


async def test_an_aws_placeholder_may_not_be_another_credentials(
    api: httpx.AsyncClient, store: Store
) -> None:
    """The store keeps ``placeholder`` unique; an aws_sigv4 credential's secret key and session
    token placeholders live in its spec, so the API checks them against the claim's others both
    ways (409 naming the credential that has it)."""
    await claim(api)
    static = (await cred(api, name="gh")).json()["placeholder"]
    r = await cred(api, aws(secret_placeholder=static), name="aws")
    assert r.status_code == 409 and r.json()["field"] == "placeholder" and "'gh'" in r.json()["message"]
    r = await cred(api, aws(), name="aws")
    token_ph = r.json()["aws_sigv4"]["session_token_placeholder"]
    clash = await cred(api, {"hosts": ["api.test"], "value": SECRET, "placeholder": token_ph}, name="gh2")
    assert clash.status_code == 409 and "'aws'" in clash.json()["message"]
    moved = await api.patch("/v1/claims/c1/credentials/gh", json={"placeholder": token_ph})
    assert moved.status_code == 409
    no_secret(moved)
    assert store.get_credential("c1", "gh2") is None


async def test_an_aws_secret_placeholder_may_be_of_a_template(api: httpx.AsyncClient) -> None:
    """Issue 15: the control API takes any shape the one scanner recognises, as the rules file."""
    await claim(api)
    ph = templates.mint(templates.SHIPPED["stripe_test"])
    r = await cred(api, aws(secret_placeholder=ph), name="aws")
    assert r.status_code == 201, r.text
    assert r.json()["aws_sigv4"]["secret_placeholder"] == ph
