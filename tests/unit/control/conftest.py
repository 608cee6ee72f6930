"""The control API fixtures: a real app over a real store (temp SQLite + key file) and the rules
the proxy would load (tests/unit/control/world.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from proxy.control.api import make_app
from proxy.control.service import Control
from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store
from unit.control.world import RULES


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "store.sqlite3", KeyRing.load_or_create(tmp_path / "store.key"))
    yield s
    s.close()


@pytest.fixture
def control(tmp_path: Path, store: Store) -> Control:
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "tok").write_text("statictoken\n")
    return Control(Registry(load_rules(tmp_path / "rules.yaml"), store), store)


@pytest.fixture
async def api(control: Control) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=make_app(control))
    async with httpx.AsyncClient(transport=transport, base_url="http://control") as client:
        yield client
