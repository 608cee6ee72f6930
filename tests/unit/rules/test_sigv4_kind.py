"""The rules file's ``kind: aws_sigv4`` credential: it loads into a SigV4Spec with no swap
surface, and each mistake is an error at its field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from proxy.core.errors import RulesError
from proxy.rules.loader import load_rules

GOOD = """\
- name: aws
  kind: aws_sigv4
  value: file:aws.json
  placeholder: surr_AwsKeyIdPlaceholder0001
  hosts: [s3.test]
  aws_sigv4:
    secret_placeholder: surr_AwsSecretPlaceholder0001
    session_token_placeholder: surr_AwsTokenPlaceholder00001
    regions: [us-east-1]
    services: [s3]
"""


def _rules(tmp_path: Path, creds: str) -> Path:
    (tmp_path / "token").write_text("t")
    value = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": "s"}
    (tmp_path / "aws.json").write_text(json.dumps(value))
    head = textwrap.dedent("""\
        version: 1
        pools:
          p:
            egress:
              - host: s3.test
        claims:
          - id: c
            pool: p
            proxy_token: file:token
            credentials:
        """)
    path = tmp_path / "rules.yaml"
    path.write_text(head + textwrap.indent(creds, "      "))
    return path


def test_aws_sigv4_loads_with_no_swap_surface(tmp_path: Path) -> None:
    cred = load_rules(_rules(tmp_path, GOOD)).claims["c"].credentials[0]
    assert cred.sigv4 is not None and cred.surfaces == frozenset()
    assert cred.sigv4.allowed.permits("us-east-1", "s3") and not cred.sigv4.allowed.permits("eu-west-1", "s3")
    assert "surr_AwsSecretPlaceholder0001" not in repr(cred)


BAD = [
    ("no-block", GOOD.split("  aws_sigv4:")[0], "needs an aws_sigv4 block"),
    ("block-without-kind", GOOD.replace("  kind: aws_sigv4\n", ""), "only for a credential of kind"),
    ("secret-not-placeholder", GOOD.replace("surr_AwsSecretPlaceholder0001", "plain"), "secret_placeholder"),
    ("secret-same-as-key-id", GOOD.replace("surr_AwsSecretPlaceholder0001", "surr_AwsKeyIdPlaceholder0001"),
     "secret_placeholder"),
    ("no-regions", GOOD.replace("    regions: [us-east-1]\n", ""), "regions"),
    ("empty-services", GOOD.replace("services: [s3]", "services: []"), "services"),
    ("injected", GOOD + "  inject: {set_header: X-Key}\n", "signed, not injected"),
    ("unknown-kind", GOOD.replace("kind: aws_sigv4", "kind: aws_sigv2"), "kind"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "creds", "says"), BAD, ids=[b[0] for b in BAD])
def test_mistakes_are_errors_at_their_field(tmp_path: Path, name: str, creds: str, says: str) -> None:
    with pytest.raises(RulesError) as e:
        load_rules(_rules(tmp_path, creds))
    assert says in str(e.value)


def test_every_placeholder_of_the_kind_is_the_claims(tmp_path: Path) -> None:
    """Generated (checksummed) secret and token placeholders are this claim's: never forged."""
    from proxy.core import placeholders
    from proxy.core.forgery import find_forged

    secret, token = placeholders.generate(), placeholders.generate()
    text = GOOD.replace("surr_AwsSecretPlaceholder0001", secret).replace(
        "surr_AwsTokenPlaceholder00001", token
    )
    claim = load_rules(_rules(tmp_path, text)).claims["c"]
    assert {secret.encode(), token.encode(), b"surr_AwsKeyIdPlaceholder0001"} <= set(claim.by_placeholder)
    fields = [(b"X-Amz-Security-Token", token.encode()), (b"X-Leak", secret.encode())]
    assert not find_forged(fields, b"/", claim.by_placeholder)
