"""A claim's ``interface`` (transparent mode): loaded, and refused where it cannot bind."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proxy.core import templates
from proxy.core.errors import RulesError
from proxy.rules.loader import load_rules


def rules(tmp_path: Path, claim_extra: str) -> Path:
    (tmp_path / "token").write_text("t")
    path = tmp_path / "rules.yaml"
    path.write_text(
        textwrap.dedent("""\
        version: 1
        pools:
          p:
            egress:
              - host: api.test
        claims:
          - id: c
            pool: p
            proxy_token: file:token
        """)
        + textwrap.indent(textwrap.dedent(claim_extra), "    ")
    )
    return path


def test_a_claim_bound_to_an_interface_loads(tmp_path: Path) -> None:
    policy = load_rules(rules(tmp_path, "sources: [10.0.0.2/32]\ninterface: veth-a\n"))
    assert policy.claims["c"].interface == "veth-a"
    assert load_rules(rules(tmp_path, "sources: [10.0.0.2/32]\n")).claims["c"].interface is None


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("sources: [10.0.0.2/32]\ninterface: 'eth0; rm -rf /'\n", "not an interface name"),
        ("sources: [10.0.0.2/32]\ninterface: a-name-longer-than-15\n", "not an interface name"),
        ("interface: veth-a\n", "interface needs sources"),
    ],
    ids=["shell", "too-long", "no-sources"],
)
def test_an_interface_that_cannot_bind_is_an_error_at_its_field(
    tmp_path: Path, extra: str, says: str
) -> None:
    with pytest.raises(RulesError) as e:
        load_rules(rules(tmp_path, extra))
    assert says in str(e.value) and "interface" in str(e.value)


# -- placeholder templates (issue 15) ---------------------------------------------------------


def _templated(tmp_path: Path, placeholder: str, template: str) -> Path:
    (tmp_path / "secret").write_text("CANARYtemplate-rules-01\n")
    return rules(
        tmp_path,
        f"""\
        credentials:
          - name: gh
            value: file:secret
            placeholder: {placeholder}
            placeholder_template: {template}
            hosts: [api.test]
        """,
    )


def test_a_credential_with_a_placeholder_of_its_template_loads(tmp_path: Path) -> None:
    ph = templates.mint(templates.SHIPPED["github_classic"])
    (cred,) = load_rules(_templated(tmp_path, ph, "github_classic")).claims["c"].credentials
    assert cred.placeholder == ph


@pytest.mark.parametrize(
    ("placeholder", "template", "says"),
    [
        ("surr_" + "A1" * 12, "github_classic", "is not of template 'github_classic'"),
        ("ghp_" + "A1" * 18, "openai", "is not of template 'openai'"),
        ("ghp_" + "A1" * 18, "nope", "unknown placeholder template 'nope'"),
    ],
    ids=["surr", "other-template", "unknown"],
)
def test_a_placeholder_that_does_not_fit_its_template_is_an_error_at_its_field(
    tmp_path: Path, placeholder: str, template: str, says: str
) -> None:
    with pytest.raises(RulesError) as e:
        load_rules(_templated(tmp_path, placeholder, template))
    assert says in str(e.value) and "placeholder" in str(e.value)
