"""Fixtures of the dry-run tests: the rules file of :mod:`unit.cli.world` with its secret files,
the policy it loads, and a state dir whose store holds one claim."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.core.policy import Policy
from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store
from unit.cli.world import RULES, SECRETS, STORE_SECRET


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    for name, value in SECRETS.items():
        (tmp_path / name).write_text(value + "\n")
    path = tmp_path / "rules.yaml"
    path.write_text(textwrap.dedent(RULES))
    return path


@pytest.fixture
def policy(rules_file: Path) -> Policy:
    return load_rules(rules_file)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A state dir whose store holds claim s1 (pool p) with credential 'st' bound to api.test."""
    state = tmp_path / "state"
    state.mkdir()
    with Store.open(state / "store.sqlite3", KeyRing.load_or_create(state / "store.key")) as store:
        store.create_claim("s1", "p")
        rec = store.put_credential("s1", "st", value=STORE_SECRET.encode(), hosts=["api.test"])
    yield state, rec.placeholder
