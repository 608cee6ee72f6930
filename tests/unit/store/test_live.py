"""Live values: a credential's current value and its recently replaced ones, for scrubbing."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential
from proxy.core.secrets import Secret
from proxy.rules.sources import ValueSource
from proxy.store import live
from proxy.store.keyring import KeyRing
from proxy.store.registry import StoreValue
from proxy.store.sqlite import FILENAME, HISTORY_VERSIONS, Store


def _put(store: Store, value: bytes, name: str = "gh") -> None:
    store.put_credential("c1", name, value=value, hosts=["api.test"])


def _cred(source: object) -> Credential:
    return Credential("gh", "surr_Placeholder0123456789", (HostPattern.parse("api.test"),), source)  # type: ignore[arg-type]


def test_a_replaced_store_value_is_kept_sealed_and_survives_reopening(
    tmp_path: Path, ring: KeyRing, store: Store
) -> None:
    _put(store, b"CANARYone")
    _put(store, b"CANARYtwo")
    store.patch_credential("c1", "gh", hosts=["other.test"])  # metadata only: nothing replaced
    store.close()
    with Store.open(tmp_path, ring) as again:
        assert [(v, ver) for v, ver, _ in again.previous_secrets("c1", "gh")] == [(b"CANARYone", 1)]
        assert live.live_values(_cred(StoreValue(again, "c1", "gh")), time.time()) == [
            Secret("CANARYtwo"),
            Secret("CANARYone"),
        ]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob(f"{FILENAME}*"))
    assert b"CANARYone" not in raw


def test_history_keeps_the_newest_versions_only(store: Store) -> None:
    for i in range(HISTORY_VERSIONS + 3):
        _put(store, f"CANARY{i}".encode())
    kept = [v for v, _, _ in store.previous_secrets("c1", "gh")]
    assert kept == [f"CANARY{i}".encode() for i in range(HISTORY_VERSIONS + 1, 0, -1)][:HISTORY_VERSIONS]


def test_values_outside_the_window_are_not_live(tmp_path: Path, store: Store) -> None:
    _put(store, b"CANARYold")
    _put(store, b"CANARYnew")
    later = time.time() + live.LIVE_SECONDS + 1
    assert live.live_values(_cred(StoreValue(store, "c1", "gh")), later) == [Secret("CANARYnew")]


def test_deleting_the_credential_drops_its_history(tmp_path: Path, store: Store) -> None:
    _put(store, b"CANARYold")
    _put(store, b"CANARYnew")
    store.delete_credential("c1", "gh")
    with contextlib.closing(sqlite3.connect(tmp_path / FILENAME)) as db:
        assert db.execute("SELECT COUNT(*) FROM credential_history").fetchone()[0] == 0


def test_key_rotation_reencrypts_history_too(store: Store, ring: KeyRing) -> None:
    _put(store, b"CANARYold")
    _put(store, b"CANARYnew")
    first = ring.current
    assert store.rotate_keys() == 2
    assert first not in ring.key_ids
    assert [v for v, _, _ in store.previous_secrets("c1", "gh")] == [b"CANARYold"]


def test_a_file_source_remembers_what_it_read_before(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("CANARYa\n")
    source = ValueSource.parse(f"file:{path}", tmp_path)
    cred = _cred(source)
    assert live.live_values(cred, time.time()) == [Secret("CANARYa")]
    path.write_text("CANARYbb\n")
    assert live.live_values(cred, time.time()) == [Secret("CANARYbb"), Secret("CANARYa")]
    assert live.live_values(cred, time.time() + live.LIVE_SECONDS + 1) == [Secret("CANARYbb")]


def test_an_unreadable_current_value_still_leaves_previous_ones(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("CANARYa\n")
    cred = _cred(ValueSource.parse(f"file:{path}", tmp_path))
    live.live_values(cred, time.time())
    path.write_text("CANARYb\n")
    live.live_values(cred, time.time())
    path.unlink()
    assert live.live_values(cred, time.time()) == [Secret("CANARYa")]
