"""Fixtures shared by the unit tests of the credential store (test_store.py, test_live.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return KeyRing.load_or_create(tmp_path / "keys.json")


@pytest.fixture
def store(tmp_path: Path, ring: KeyRing) -> Iterator[Store]:
    """A store with one claim, ``c1`` of pool ``agents``."""
    with Store.open(tmp_path, ring) as s:
        s.create_claim("c1", "agents")
        yield s
