"""The audit entry of a credential of a kind other than ``static`` names its kind and what was
applied (issue 15), never a value: every kind, every grant and HMAC algorithm, checked against
docs/audit-schema.json so that a kind or an algorithm added in the code shows up there too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from addons.audit import _credentials, _kind
from proxy.core import hmacsign, mint
from proxy.core.policy import Claim
from proxy.rules.kinds import KINDS
from proxy.rules.loader import load_rules

ROOT = Path(__file__).resolve().parents[3]
PH = "surr_AuditKindsPlaceholder0001"
SECRET = "audit-kinds-secret-value"
MINT = {"token_url": "https://api.test/oauth/token", "client_id": "cid"}
AWS = {
    "secret_placeholder": "surr_AuditKindsAwsSecret00001",
    "regions": ["us-east-1"],
    "services": ["s3"],
}


def _claim(tmp_path: Path, **cred: Any) -> Claim:
    (tmp_path / "token").write_text("proxy-token-value\n")
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "refresh").write_text("refresh-" + SECRET + "\n")
    aws = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": SECRET}
    (tmp_path / "aws.json").write_text(json.dumps(aws))
    c = {"name": "k", "value": "file:secret", "placeholder": PH, "hosts": ["api.test"], **cred}
    doc = {
        "version": 1,
        "pools": {"p": {"egress": [{"host": "api.test"}]}},
        "claims": [{"id": "c1", "pool": "p", "proxy_token": "file:token", "credentials": [c]}],
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_rules(path).claims["c1"]


def _entry_schema() -> dict[str, Any]:
    schema = json.loads((ROOT / "docs" / "audit-schema.json").read_text(encoding="utf-8"))
    return {**schema["$defs"]["credentials"]["items"], "$defs": schema["$defs"]}


def _entry(claim: Claim, applied: dict[str, str], signed: dict[str, str]) -> dict[str, Any]:
    (entry,) = [{**c, **_kind(claim, c["name"], signed)} for c in _credentials({"k": 1}, applied)]
    Draft202012Validator(_entry_schema()).validate(entry)
    assert SECRET not in json.dumps(entry) and PH not in json.dumps(entry)
    return entry


ONE = {"name": "k", "version": 1}
CASES = [
    ("static", {}, {}, {}, ONE),
    *[
        (f"hmac-{alg}", {"kind": "hmac", "sign": {"algorithm": alg, "header": "X-Sig"}}, {"k": "hmac_signed"},
         {}, {**ONE, "kind": "hmac", "applied": "hmac_signed", "signature": alg, "header": "X-Sig"})
        for alg in hmacsign.ALGORITHMS
    ],
    ("oauth-client-credentials-minted", {"kind": "oauth_client", "mint": MINT}, {"k": "token_minted"}, {},
     {**ONE, "kind": "oauth_client", "applied": "token_minted", "grant": "client_credentials"}),
    ("oauth-refresh-token-cached",
     {"kind": "oauth_client", "mint": {**MINT, "grant": "refresh_token", "refresh_token": "file:refresh"}},
     {"k": "token_cached"}, {},
     {**ONE, "kind": "oauth_client", "applied": "token_cached", "grant": "refresh_token"}),
    ("aws-sigv4", {"kind": "aws_sigv4", "value": "file:aws.json", "aws_sigv4": AWS}, {}, {"k": "sigv4"},
     {**ONE, "kind": "aws_sigv4", "applied": "sigv4_signed", "signature": "sigv4"}),
]  # fmt: skip


Row = tuple[dict[str, Any], dict[str, str], dict[str, str], dict[str, Any]]


@pytest.mark.parametrize("row", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_kind_names_itself_and_what_was_applied(tmp_path: Path, row: Row) -> None:
    cred, applied, signed, expected = row
    assert _entry(_claim(tmp_path, **cred), applied, signed) == expected


def test_the_schema_lists_every_kind_grant_and_algorithm_of_the_code() -> None:
    props = _entry_schema()["properties"]
    assert set(props["kind"]["enum"]) == set(KINDS) - {"static"}
    assert set(props["grant"]["enum"]) == set(mint.GRANTS)
    assert set(props["signature"]["enum"]) == {"sigv4", *hmacsign.ALGORITHMS}
    assert set(props["applied"]["enum"]) == {"token_minted", "token_cached", "hmac_signed", "sigv4_signed"}


class _Unwalkable(tuple):  # type: ignore[type-arg]
    """A claim's credentials that fail the test when walked: per-request code must read the
    subsets Claim.build derives once, or its cost grows with the claim (make bench measured a
    10,000-credential claim at 0.57× the 1-credential req/s when the audit walked them)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("per-request code walked claim.credentials")


@pytest.mark.parametrize("row", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_audit_entry_and_the_signers_never_walk_the_claims_credentials(tmp_path: Path, row: Row) -> None:
    import dataclasses

    from addons.sigv4 import _signers

    cred, applied, signed, expected = row
    claim = _claim(tmp_path, **cred)
    walled = dataclasses.replace(claim, credentials=_Unwalkable(claim.credentials))
    (entry,) = [{**c, **_kind(walled, c["name"], signed)} for c in _credentials({"k": 1}, applied)]
    assert entry == expected
    assert [c.name for c in _signers(walled)] == (["k"] if cred.get("kind") == "aws_sigv4" else [])
    assert [c.name for c in walled.signing] == (["k"] if cred.get("kind") == "hmac" else [])
