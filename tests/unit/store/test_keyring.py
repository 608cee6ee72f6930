"""proxy.store.keyring: AES-256-GCM keys in a 0600 key file; unsafe or malformed files are refused."""

from __future__ import annotations

import base64
import json
import os
import pickle
import stat
import threading
from pathlib import Path

import pytest

from proxy.core.errors import SurrogateError
from proxy.store.keyring import DecryptError, KeyFileError, KeyRing

AAD = b"c1\0gh\x001"


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return KeyRing.load_or_create(tmp_path / "state" / "keys.json")


def _doc(path: Path) -> dict[str, object]:
    doc = json.loads(path.read_bytes())
    assert isinstance(doc, dict)
    return doc


def test_round_trip(ring: KeyRing) -> None:
    key_id, blob = ring.encrypt(b"hunter2", AAD)
    assert key_id == ring.current
    assert b"hunter2" not in blob
    assert ring.decrypt(key_id, blob, AAD) == b"hunter2"


def test_each_encryption_uses_a_fresh_nonce(ring: KeyRing) -> None:
    assert ring.encrypt(b"v", AAD)[1] != ring.encrypt(b"v", AAD)[1]


@pytest.mark.parametrize(
    ("key_id", "blob", "aad", "message"),
    [
        (None, None, b"c1\0gh\x002", "fails authentication"),
        ("00000000", None, AAD, "no key '00000000'"),
        (None, b"short", AAD, "truncated"),
        (None, "flip", AAD, "fails authentication"),
    ],
    ids=["aad-mismatch", "unknown-key-id", "truncated", "tampered"],
)
def test_decrypt_failures_raise_decrypt_error(
    ring: KeyRing, key_id: str | None, blob: bytes | str | None, aad: bytes, message: str
) -> None:
    kid, good = ring.encrypt(b"hunter2", AAD)
    if blob == "flip":
        blob = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(DecryptError, match=message) as e:
        ring.decrypt(key_id or kid, blob if isinstance(blob, bytes) else good, aad)
    assert isinstance(e.value, SurrogateError)
    assert "hunter2" not in str(e.value)


def test_created_file_has_mode_0600_and_the_documented_format(ring: KeyRing) -> None:
    assert stat.S_IMODE(ring.path.stat().st_mode) == 0o600
    doc = _doc(ring.path)
    assert doc["version"] == 1 and doc["current"] == ring.current
    keys = doc["keys"]
    assert isinstance(keys, dict) and list(keys) == [ring.current]
    assert len(ring.current) == 8 and int(ring.current, 16) >= 0
    assert len(base64.b64decode(keys[ring.current])) == 32
    assert not [p for p in ring.path.parent.iterdir() if p.name.endswith(".tmp")]


def test_loading_again_gives_the_same_keys(ring: KeyRing) -> None:
    kid, blob = ring.encrypt(b"v", AAD)
    again = KeyRing.load_or_create(ring.path)
    assert again.current == kid and again.decrypt(kid, blob, AAD) == b"v"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660, 0o644])
def test_group_or_other_accessible_file_is_refused(ring: KeyRing, mode: int) -> None:
    os.chmod(ring.path, mode)
    with pytest.raises(KeyFileError, match="accessible by group or others") as e:
        KeyRing.load_or_create(ring.path)
    assert str(ring.path) in str(e.value) and f"{mode:04o}" in str(e.value)


_GOOD_KEY = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b"[]", '"version": 1'),
        (json.dumps({"version": 2, "current": "aaaaaaaa", "keys": {"aaaaaaaa": _GOOD_KEY}}), '"version": 1'),
        (json.dumps({"version": 1, "current": "aaaaaaaa", "keys": {}}), 'no "keys"'),
        (json.dumps({"version": 1, "current": "aaaaaaaa", "keys": {"AAAA": _GOOD_KEY}}), "malformed key id"),
        (json.dumps({"version": 1, "current": "aaaaaaaa", "keys": {"aaaaaaaa": "!!"}}), "not base64"),
        (json.dumps({"version": 1, "current": "aaaaaaaa", "keys": {"aaaaaaaa": "AAAA"}}), "exactly 32"),
        (json.dumps({"version": 1, "current": "aaaaaaaa", "keys": {"aaaaaaaa": 7}}), "not base64"),
        (json.dumps({"version": 1, "current": "bbbbbbbb", "keys": {"aaaaaaaa": _GOOD_KEY}}), '"current"'),
    ],
    ids=[
        "empty",
        "not-json",
        "not-object",
        "version-2",
        "no-keys",
        "bad-key-id",
        "bad-base64",
        "short-key",
        "key-not-string",
        "current-missing",
    ],
)
def test_malformed_file_is_refused_naming_file_and_fault(
    tmp_path: Path, content: bytes | str, message: str
) -> None:
    path = tmp_path / "keys.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content.encode() if isinstance(content, str) else content)
    os.close(fd)
    with pytest.raises(KeyFileError, match=message) as e:
        KeyRing.load_or_create(path)
    assert str(path) in str(e.value)
    assert _GOOD_KEY not in str(e.value)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keys.json").mkdir(mode=0o700)
    with pytest.raises(KeyFileError, match="keys.json"):
        KeyRing.load_or_create(tmp_path / "keys.json")


def test_add_key_makes_a_new_current_key_and_keeps_old_ones(ring: KeyRing) -> None:
    old, blob = ring.encrypt(b"old value", AAD)
    new = ring.add_key()
    assert new != old and ring.current == new and set(ring.key_ids) == {old, new}
    assert ring.encrypt(b"x", AAD)[0] == new
    assert ring.decrypt(old, blob, AAD) == b"old value"
    reloaded = KeyRing.load_or_create(ring.path)  # persisted
    assert reloaded.current == new and reloaded.decrypt(old, blob, AAD) == b"old value"
    assert stat.S_IMODE(ring.path.stat().st_mode) == 0o600


def test_retire_removes_a_key_but_refuses_the_current_one(ring: KeyRing) -> None:
    old = ring.current
    _, blob = ring.encrypt(b"v", AAD)
    with pytest.raises(ValueError, match="current key"):
        ring.retire(old)
    ring.add_key()
    assert ring.retire(old) is True
    assert ring.retire(old) is False  # already gone: re-running a rotation is harmless
    assert old not in KeyRing.load_or_create(ring.path).key_ids
    with pytest.raises(DecryptError):
        ring.decrypt(old, blob, AAD)


def test_another_instances_new_key_is_found_when_needed(ring: KeyRing) -> None:
    """Two processes share the key file: a key added by one decrypts in the other."""
    other = KeyRing.load_or_create(ring.path)
    kid = other.add_key()
    _, blob = other.encrypt(b"v", AAD)
    assert ring.decrypt(kid, blob, AAD) == b"v"
    ring.add_key()  # adding re-reads the file, so other's key survives
    assert kid in KeyRing.load_or_create(ring.path).key_ids


def test_repr_shows_ids_never_key_material(ring: KeyRing) -> None:
    ring.add_key()
    keys = _doc(ring.path)["keys"]
    assert isinstance(keys, dict)
    shown = repr(ring) + str(ring) + repr(ring._keys)
    assert ring.current in shown
    for b64 in keys.values():
        raw = base64.b64decode(b64)
        assert b64 not in shown and raw.hex() not in shown and repr(raw) not in shown


def test_keyring_is_not_picklable(ring: KeyRing) -> None:
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(ring)


def test_concurrent_creation_yields_one_key_for_everyone(tmp_path: Path) -> None:
    """The proxy and a sidecar starting at once must not each write (and use) a different key."""
    path = tmp_path / "fresh" / "keys.json"
    barrier = threading.Barrier(20)
    currents: list[str] = []

    def load() -> None:
        barrier.wait()
        currents.append(KeyRing.load_or_create(path).current)

    threads = [threading.Thread(target=load) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(currents) == 20 and set(currents) == {KeyRing.load_or_create(path).current}
