"""Rules files: credentials of kind ``oauth_client`` (proxy.rules.kinds). The token endpoint's
host must be one of the credential's hosts (refused at load, with the field named); every
other bad ``mint`` field is said where it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.core.errors import RulesError
from proxy.core.mint import Minting, TokenSlot
from proxy.core.policy import Injection
from proxy.rules.loader import load_rules

PH = "surr_KindsUnitPlaceholder000001"


def _file(tmp_path: Path, **cred: Any) -> Path:
    (tmp_path / "token").write_text("proxy-token-value\n")
    (tmp_path / "secret").write_text("client-secret-value\n")
    (tmp_path / "refresh").write_text("refresh-token-value\n")
    c = {"name": "api", "value": "file:secret", "placeholder": PH, "hosts": ["api.test", "auth.test"]}
    c.update(cred)
    doc = {
        "version": 1,
        "pools": {"p": {"egress": [{"host": "api.test"}, {"host": "auth.test"}]}},
        "claims": [{"id": "c1", "pool": "p", "proxy_token": "file:token", "credentials": [c]}],
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


MINT = {"token_url": "https://auth.test/oauth/token", "client_id": "cid"}


def test_an_oauth_client_credential_loads_with_a_bearer_injection(tmp_path: Path) -> None:
    policy = load_rules(_file(tmp_path, kind="oauth_client", mint=MINT))
    (c,) = policy.claims["c1"].credentials
    assert c.kind == "oauth_client" and isinstance(c.mint, Minting)
    assert c.inject == Injection("Authorization", "Bearer {value}")
    assert isinstance(c.source, TokenSlot) and c.source is c.mint.slot
    assert c.mint.spec.client_auth == "secret_basic" and c.mint.spec.token_url.path == "/oauth/token"
    assert "client-secret-value" not in repr(c) + repr(c.mint)


BAD = [
    ("host-not-covered", {"mint": {**MINT, "token_url": "https://other.test/token"}}, "mint.token_url",
     "not one of the credential's hosts"),
    ("http-url", {"mint": {**MINT, "token_url": "http://auth.test/token"}}, "mint.token_url", "https:"),
    ("userinfo", {"mint": {**MINT, "token_url": "https://u:p@auth.test/t"}}, "mint.token_url", "userinfo"),
    ("grant", {"mint": {**MINT, "grant": "password"}}, "mint.grant", "unknown grant"),
    ("client-auth", {"mint": {**MINT, "client_auth": "mtls"}}, "mint.client_auth", "unknown client_auth"),
    ("refresh-missing", {"mint": {**MINT, "grant": "refresh_token"}}, "mint.refresh_token", "needs"),
    ("refresh-extra", {"mint": {**MINT, "refresh_token": "file:refresh"}}, "mint.refresh_token", "only for"),
    ("scope", {"mint": {**MINT, "scopes": ["a b"]}}, "mint.scopes", "scope token"),
    ("jwt-no-key", {"mint": {**MINT, "grant": "jwt_bearer"}}, "value", "PEM private key"),
    ("jwt-secret-auth", {"mint": {**MINT, "grant": "jwt_bearer", "client_auth": "secret_post"}},
     "mint.client_auth", "private key"),
    ("no-mint", {}, "mint", "needs mint"),
    ("mint-on-static", {"kind": "static", "mint": MINT}, "mint", "kind oauth_client"),
    ("unknown-kind", {"kind": "magic"}, "kind", "unknown kind"),
    ("hmac-algorithm", {"kind": "hmac", "sign": {"algorithm": "md5"}}, "sign.algorithm", "unknown"),
    ("hmac-header", {"kind": "hmac", "sign": {"header": "Host"}}, "sign.header", "may set"),
    ("hmac-inject", {"kind": "hmac", "inject": {"set_header": "X-A"}}, "inject", "remove inject"),
    ("sign-on-static", {"kind": "static", "sign": {}}, "sign", "kind hmac"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "where", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_oauth_client_credential_is_refused_at_load(
    tmp_path: Path, extra: dict[str, Any], where: str, says: str
) -> None:
    extra = {"kind": "oauth_client", **extra} if "kind" not in extra else extra
    with pytest.raises(RulesError) as info:
        load_rules(_file(tmp_path, **extra))
    found = [(str(p.path) if hasattr(p, "path") else "", str(p)) for p in info.value.problems]
    assert any(where in text and says in text for _, text in found), found
    assert all("client-secret-value" not in text for _, text in found)


def test_an_hmac_credential_loads_with_the_documented_example_defaults(tmp_path: Path) -> None:
    (c,) = load_rules(_file(tmp_path, kind="hmac")).claims["c1"].credentials
    assert c.sign is not None and c.inject is None
    assert (c.sign.algorithm, c.sign.header, c.sign.timestamp_header) == (
        "hmac-sha256",
        "X-Signature",
        "X-Timestamp",
    )


def test_rules_explain_says_what_each_kind_does(tmp_path: Path) -> None:
    from proxy.cli.explain import explain

    policy = load_rules(_file(tmp_path, kind="oauth_client", mint=MINT))
    notes = " ".join(explain(policy, "c1", "GET", "https://api.test/x").notes)
    assert "kind oauth_client" in notes and "https://auth.test/oauth/token" in notes
    assert "client-secret-value" not in notes
    (tmp_path / "x").mkdir()
    policy = load_rules(_file(tmp_path / "x", kind="hmac"))
    notes = " ".join(explain(policy, "c1", "POST", "https://api.test/x").notes)
    assert "kind hmac" in notes and "X-Signature" in notes
