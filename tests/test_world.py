"""The e2e world builder (tests/world.py): the rules it writes load, and its closing check bites."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from world import Stage, claim, credential, egress, rules

from proxy.rules.loader import load_rules

PH = "surr_WorldBuilderPlaceholder01"


def test_the_default_rules_are_one_pool_and_one_claim_that_load(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "secret-api").write_text("v")
    text = rules([egress("api.test", 443)], credentials=[credential("api", PH, ["api.test"])])
    assert yaml.safe_load(text) == {
        "version": 1,
        "pools": {"p": {"egress": [{"host": "api.test", "ports": [443]}]}},
        "claims": [
            {
                "id": "c1",
                "pool": "p",
                "proxy_token": "file:token",
                "credentials": [
                    {"name": "api", "value": "file:secret-api", "placeholder": PH, "hosts": ["api.test"]}
                ],
            }
        ],
    }
    (tmp_path / "rules.yaml").write_text(text)
    policy = load_rules(tmp_path / "rules.yaml")
    assert list(policy.claims) == ["c1"]


def test_a_piece_used_twice_is_written_twice_not_as_a_yaml_alias(tmp_path: Path) -> None:
    """The loader refuses anchors and aliases; a list shared by two pools must not become one."""
    shared = [egress("api.test", 443)]
    text = rules(pools={"a": {"egress": shared}, "b": {"egress": shared}}, claims=[claim("c", pool="a")])
    assert "&" not in text and "*" not in text
    (tmp_path / "token").write_text("t")
    (tmp_path / "rules.yaml").write_text(text)
    assert set(load_rules(tmp_path / "rules.yaml").pools) == {"a", "b"}


def test_lists_of_plain_values_stay_on_one_line_so_tests_can_edit_the_text() -> None:
    text = rules([egress("*", ports=[80, 443], scheme="http")], claims=[])
    assert "ports: [80, 443]" in text and "host: '*'" in text


def test_the_closing_check_fails_on_a_canary_a_client_received(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="canary secret found in client-received bytes"):  # noqa: SIM117
        with Stage(tmp_path) as st:
            value = st.secret("leak")
            st.received.append(b"... Bearer " + value.encode())


def test_the_closing_check_is_skipped_when_the_test_already_failed(tmp_path: Path) -> None:
    with pytest.raises(KeyError), Stage(tmp_path) as st:
        st.received.append(st.secret("other").encode())
        raise KeyError("the test's own failure is the one reported")
