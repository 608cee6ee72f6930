"""proxy.store.sqlite: the SQLite credential store (claims, tokens, encrypted credentials, versions)."""

from __future__ import annotations

import base64
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import canary
import pytest

from proxy.core import placeholders
from proxy.core.errors import SurrogateError
from proxy.store.keyring import DecryptError, KeyRing
from proxy.store.sqlite import (
    FILENAME,
    SCHEMA_VERSION,
    Conflict,
    CredentialStore,
    NotFound,
    PreconditionFailed,
    Store,
    StoreError,
)

CANARY = canary.register("canary-8c1f3e0b7d6a4f2e9b5c1a0d3e7f6b4a").encode()  # in the session-end scan
PLACEHOLDER = "surr_TestPlaceholder0123456789"


def _put(store: Store, name: str = "gh", value: bytes = b"v1", **kw: Any) -> Any:
    return store.put_credential("c1", name, value=value, hosts=kw.pop("hosts", ["api.github.com"]), **kw)


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def _files(tmp_path: Path) -> bytes:
    """The bytes of the store file, its WAL and its shared-memory index (those that exist)."""
    paths = [tmp_path / f"{FILENAME}{suffix}" for suffix in ("", "-wal", "-shm")]
    return b"".join(p.read_bytes() for p in paths if p.exists())


# --- opening ----------------------------------------------------------------------------------


def test_open_creates_a_versioned_wal_file_with_mode_0600(tmp_path: Path, store: Store) -> None:
    assert store.path == tmp_path / FILENAME
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / f"{FILENAME}-wal").stat().st_mode) == 0o600
    db = _raw(store.path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_reopening_by_file_path_keeps_the_data(tmp_path: Path, ring: KeyRing, store: Store) -> None:
    _put(store)
    with Store.open(tmp_path / FILENAME, ring) as again:
        assert again.secret("c1", "gh") == (b"v1", 1)


def test_a_newer_schema_is_refused(tmp_path: Path, ring: KeyRing) -> None:
    Store.open(tmp_path, ring).close()
    db = _raw(tmp_path / FILENAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Store.open(tmp_path, ring)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path, ring: KeyRing) -> None:
    (tmp_path / FILENAME).write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        Store.open(tmp_path, ring)


def test_a_write_blocked_past_busy_timeout_is_a_store_error(tmp_path: Path, store: Store) -> None:
    db = _raw(store.path)
    db.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        store._db.execute("PRAGMA busy_timeout = 50")
        with pytest.raises(StoreError, match="cannot be written now: database is locked"):
            _put(store)
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert _put(store).version == 1


def test_store_satisfies_the_credential_store_protocol(store: Store) -> None:
    s: CredentialStore = store
    assert repr(s) == f"Store(path={str(store.path)!r})"


# --- claims -----------------------------------------------------------------------------------


def test_create_claim_returns_record_and_token(store: Store) -> None:
    claim, token = store.create_claim(
        "c2", "ci", ["10.0.0.7", "10.1.2.3/16", "2001:db8:0::1/64", "10.0.0.7/32"]
    )
    assert (claim.id, claim.pool, claim.version) == ("c2", "ci", 1)
    assert claim.sources == ("10.0.0.7/32", "10.1.0.0/16", "2001:db8::/64")
    assert claim.created_at == claim.updated_at and abs(claim.created_at - time.time()) < 5
    assert len(token) >= 43 and token not in repr(claim)
    assert store.get_claim("c2") == claim
    assert store.get_claim("nope") is None
    assert [c.id for c in store.list_claims()] == ["c1", "c2"]


@pytest.mark.parametrize(
    ("claim_id", "sources", "error", "message"),
    [
        ("c1", [], Conflict, "claim 'c1' already exists"),
        ("c3", ["10.0.0.300"], ValueError, "source '10.0.0.300' is not"),
        ("c3", "10.0.0.1", TypeError, "sequence of strings"),
        ("", [], ValueError, "non-empty"),
        ("a\0b", [], ValueError, "NUL"),
    ],
    ids=["duplicate", "bad-source", "sources-as-one-string", "empty-id", "nul-in-id"],
)
def test_create_claim_refusals(store: Store, claim_id: str, sources: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        store.create_claim(claim_id, "p", sources)
    assert [c.id for c in store.list_claims()] == ["c1"]


def test_check_token_and_only_its_hash_is_stored(tmp_path: Path, store: Store) -> None:
    _, token = store.create_claim("c2", "ci")
    assert store.check_token("c2", token) is True
    assert store.check_token("c2", token + "x") is False
    assert store.check_token("c1", token) is False
    assert store.check_token("nope", token) is False
    assert token.encode() not in _files(tmp_path)


def test_rotate_token_replaces_the_token_and_bumps_the_version(store: Store) -> None:
    _, old = store.create_claim("c2", "ci")
    claim, new = store.rotate_token("c2")
    assert claim.version == 2 and new != old
    assert store.check_token("c2", new) and not store.check_token("c2", old)
    with pytest.raises(NotFound, match="claim 'nope'"):
        store.rotate_token("nope")


def test_delete_claim_cascades_to_its_credentials(store: Store) -> None:
    _put(store, "a")
    _put(store, "b")
    store.create_claim("c2", "ci")
    store.put_credential("c2", "a", value=b"x", hosts=["h"])
    assert store.delete_claim("c1") is True
    assert store.get_claim("c1") is None and store.list_credentials("c1") == []
    assert [c.name for c in store.list_credentials("c2")] == ["a"]
    assert store.delete_claim("c1") is False


# --- credentials ------------------------------------------------------------------------------


def test_put_creates_then_replaces_keeping_placeholder_and_created_at(store: Store) -> None:
    first = _put(store, inject_header="Authorization", inject_format="Bearer {value}", expires_at=2e9)
    assert first.version == 1 and placeholders.is_placeholder(first.placeholder)
    assert (first.hosts, first.inject_header, first.inject_format) == (
        ("api.github.com",), "Authorization", "Bearer {value}",
    )  # fmt: skip
    assert first.expires_at == 2e9 and first.last_used_at is None and first.created_at == first.updated_at
    second = _put(store, value=b"v2", hosts=["*.example.com"])
    assert second.version == 2 and second.placeholder == first.placeholder
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    assert (second.inject_header, second.expires_at) == (None, None)  # put replaces the whole credential
    assert store.get_credential("c1", "gh") == second
    assert store.secret("c1", "gh") == (b"v2", 2)


def test_put_with_a_given_placeholder_uses_it(store: Store) -> None:
    assert _put(store, placeholder=PLACEHOLDER).placeholder == PLACEHOLDER
    assert (
        _put(store, placeholder="surr_AnotherPlaceholder000001").placeholder
        == "surr_AnotherPlaceholder000001"
    )


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"placeholder": "not-a-placeholder"}, ValueError, "recognisable format"),
        ({"placeholder": "surr_short"}, ValueError, "recognisable format"),
        ({"value": "text"}, TypeError, "bytes"),
        ({"hosts": "api.github.com"}, TypeError, "sequence of strings"),
        ({"claim": "nope"}, NotFound, "claim 'nope' not found"),
        ({"name": "a\0b"}, ValueError, "NUL"),
    ],
    ids=["bad-placeholder", "short-placeholder", "value-not-bytes", "hosts-one-string", "no-claim", "nul"],
)
def test_put_refusals_change_nothing(store: Store, kw: dict[str, Any], error: type, message: str) -> None:
    claim, name = kw.pop("claim", "c1"), kw.pop("name", "gh")
    args: dict[str, Any] = {"value": b"v", "hosts": ["h"], **kw}
    with pytest.raises(error, match=message):
        store.put_credential(claim, name, **args)
    assert store.list_credentials("c1") == []


def test_placeholders_are_unique_across_the_store(store: Store) -> None:
    _put(store, "gh", placeholder=PLACEHOLDER)
    store.create_claim("c2", "ci")
    with pytest.raises(
        Conflict, match=f"placeholder {PLACEHOLDER} is already used by credential 'gh' of claim 'c1'"
    ):
        store.put_credential("c2", "x", value=CANARY, hosts=["h"], placeholder=PLACEHOLDER)
    with pytest.raises(Conflict):
        _put(store, "other", placeholder=PLACEHOLDER)
    _put(store, "other")
    with pytest.raises(Conflict):
        store.patch_credential("c1", "other", placeholder=PLACEHOLDER)
    assert store.get_credential("c2", "x") is None and store.get_credential("c1", "other").version == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("call", "current"),
    [
        (lambda s: _put(s, value=b"new", if_match=7), 1),
        (lambda s: s.patch_credential("c1", "gh", value=b"new", if_match=7), 1),
        (lambda s: s.delete_credential("c1", "gh", if_match=7), 1),
        (lambda s: _put(s, "absent", if_match=1), None),
        (lambda s: s.delete_credential("c1", "absent", if_match=1), None),
    ],
    ids=[
        "put-stale",
        "patch-stale",
        "delete-stale",
        "put-create-with-if-match",
        "delete-absent-with-if-match",
    ],
)
def test_stale_if_match_fails_with_current_version_and_changes_nothing(
    store: Store, call: Any, current: int | None
) -> None:
    _put(store, value=b"v1")
    before = store.snapshot()
    with pytest.raises(PreconditionFailed) as e:
        call(store)
    assert e.value.current == current
    assert "'gh'" in str(e.value) or "'absent'" in str(e.value)
    assert store.snapshot() == before and store.secret("c1", "gh") == (b"v1", 1)


def test_matching_if_match_applies(store: Store) -> None:
    _put(store)
    assert _put(store, value=b"v2", if_match=1).version == 2
    assert store.patch_credential("c1", "gh", value=b"v3", if_match=2).version == 3
    assert store.delete_credential("c1", "gh", if_match=3) is True


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"value": b"v2"}, lambda r, s: s.secret("c1", "gh")[0] == b"v2"),
        ({"hosts": ["a.test", "*.b.test"]}, lambda r, s: r.hosts == ("a.test", "*.b.test")),
        ({"inject_header": "X-Key"}, lambda r, s: r.inject_header == "X-Key"),
        ({"inject_format": "Token {value}"}, lambda r, s: r.inject_format == "Token {value}"),
        ({"expires_at": 123.0}, lambda r, s: r.expires_at == 123.0),
        ({"expires_at": None}, lambda r, s: r.expires_at is None),
        ({"inject_header": None}, lambda r, s: r.inject_header is None),
        ({"placeholder": PLACEHOLDER}, lambda r, s: r.placeholder == PLACEHOLDER),
    ],
    ids=[
        "value",
        "hosts",
        "inject-header",
        "inject-format",
        "expires",
        "clear-expires",
        "clear-header",
        "placeholder",
    ],
)
def test_patch_changes_one_field_and_bumps_the_version(
    store: Store, change: dict[str, Any], check: Any
) -> None:
    old = _put(store, inject_header="Authorization", inject_format="Bearer {value}", expires_at=99.0)
    new = store.patch_credential("c1", "gh", **change)
    assert new.version == 2 and check(new, store)
    assert store.get_credential("c1", "gh") == new
    if "value" not in change:
        assert store.secret("c1", "gh") == (b"v1", 2)  # re-encrypted under the new version
    untouched = {f for f in ("hosts", "inject_header", "inject_format", "expires_at", "placeholder")} - set(
        change
    )
    assert all(getattr(new, f) == getattr(old, f) for f in untouched)


@pytest.mark.parametrize(
    ("name", "change", "error", "message"),
    [
        ("gh", {"colour": "red"}, TypeError, "cannot change colour"),
        ("gh", {"value": None}, ValueError, "value cannot be cleared"),
        ("gh", {"hosts": None}, ValueError, "hosts cannot be cleared"),
        ("gh", {"placeholder": "nope"}, ValueError, "recognisable format"),
        ("gh", {"value": "str"}, TypeError, "bytes"),
        ("absent", {"value": b"x"}, NotFound, "credential 'absent' of claim 'c1' not found"),
    ],
    ids=["unknown-key", "clear-value", "clear-hosts", "bad-placeholder", "value-not-bytes", "absent"],
)
def test_patch_refusals_change_nothing(
    store: Store, name: str, change: dict[str, Any], error: type, message: str
) -> None:
    _put(store)
    before = store.snapshot()
    with pytest.raises(error, match=message):
        store.patch_credential("c1", name, **change)
    assert store.snapshot() == before


def test_empty_patch_keeps_the_version(store: Store) -> None:
    rec = _put(store)
    assert store.patch_credential("c1", "gh") == rec


def test_get_list_delete_credentials(store: Store) -> None:
    store.create_claim("c2", "ci")
    for name in ("b", "a", "c"):
        _put(store, name)
    store.put_credential("c2", "z", value=b"x", hosts=["h"])
    assert [c.name for c in store.list_credentials("c1")] == ["a", "b", "c"]
    assert store.get_credential("c1", "z") is None
    assert store.delete_credential("c1", "b") is True
    assert store.delete_credential("c1", "b") is False
    assert [c.name for c in store.list_credentials("c1")] == ["a", "c"]
    with pytest.raises(NotFound, match="credential 'b' of claim 'c1' not found"):
        store.secret("c1", "b")


def test_records_hold_no_secret(store: Store) -> None:
    rec = _put(store, value=CANARY)
    assert CANARY.decode() not in repr(rec) + repr(store.snapshot()) + repr(store)


@pytest.mark.parametrize(
    "tamper",
    [
        "UPDATE credentials SET (key_id, value) = (SELECT key_id, value FROM credentials WHERE name = 'gh') "
        "WHERE name = 'other'",
        "UPDATE credentials SET version = version + 1 WHERE name = 'other'",
        "UPDATE credentials SET claim_id = 'c2' WHERE name = 'other'",
    ],
    ids=["copied-to-another-row", "moved-to-another-version", "moved-to-another-claim"],
)
def test_a_ciphertext_moved_elsewhere_fails_to_decrypt(store: Store, tamper: str) -> None:
    store.create_claim("c2", "ci")
    _put(store, "gh", value=CANARY)
    _put(store, "other", value=b"other value")
    db = _raw(store.path)
    db.execute(tamper)
    db.close()
    where = ("c2", "other") if "c2" in tamper else ("c1", "other")
    with pytest.raises(DecryptError, match=f"credential 'other' of claim '{where[0]}'") as e:
        store.secret(*where)
    assert CANARY.decode() not in str(e.value)
    assert isinstance(e.value, SurrogateError)


# --- use, change detection, rotation ----------------------------------------------------------


def test_touch_used_records_use_without_a_version_bump_at_most_once_a_second(store: Store) -> None:
    _put(store)
    dv = store.data_version()
    store.touch_used("c1", "gh", 1000.0)
    assert store.get_credential("c1", "gh").last_used_at == 1000.0  # type: ignore[union-attr]
    store.touch_used("c1", "gh", 1000.5)  # within a second: skipped
    assert store.get_credential("c1", "gh").last_used_at == 1000.0  # type: ignore[union-attr]
    store.touch_used("c1", "gh", 1001.5)
    rec = store.get_credential("c1", "gh")
    assert rec is not None and rec.last_used_at == 1001.5 and rec.version == 1
    assert store.data_version() == dv  # own bookkeeping is not a change worth a rebuild
    store.touch_used("c1", "absent", 5.0)  # a credential deleted meanwhile is not an error


def test_data_version_changes_after_own_and_other_connections_writes(
    tmp_path: Path, ring: KeyRing, store: Store
) -> None:
    v0 = store.data_version()
    assert store.data_version() == v0
    _put(store)
    v1 = store.data_version()
    assert v1 != v0
    with Store.open(tmp_path, KeyRing.load_or_create(ring.path)) as other:
        o0 = other.data_version()
        other.patch_credential("c1", "gh", value=b"from other")
        assert store.data_version() != v1
        assert store.secret("c1", "gh") == (b"from other", 2)
        assert other.data_version() != o0


def test_snapshot_returns_everything(store: Store) -> None:
    store.create_claim("c2", "ci", ["10.0.0.0/8"])
    a, b = _put(store, "a"), store.put_credential("c2", "b", value=b"x", hosts=["h"])
    claims, creds = store.snapshot()
    assert claims == store.list_claims() and [c.id for c in claims] == ["c1", "c2"]
    assert creds == [a, b]


def _key_ids(path: Path) -> set[str]:
    db = _raw(path)
    try:
        return {r[0] for r in db.execute("SELECT key_id FROM credentials")}
    finally:
        db.close()


def test_rotate_keys_reencrypts_everything_and_retires_the_old_key(store: Store, ring: KeyRing) -> None:
    old = ring.current
    recs = [_put(store, f"n{i}", value=f"value {i}".encode()) for i in range(7)]
    assert store.rotate_keys(batch_size=3) == 7
    assert ring.current != old and ring.key_ids == (ring.current,)
    assert _key_ids(store.path) == {ring.current}
    assert [store.secret("c1", f"n{i}") for i in range(7)] == [(f"value {i}".encode(), 1) for i in range(7)]
    assert store.list_credentials("c1") == recs  # versions and metadata untouched
    assert store.rotate_keys(new_key=False) == 0  # idempotent
    assert ring.key_ids == (ring.current,)


def test_an_interrupted_rotation_resumes(store: Store, ring: KeyRing) -> None:
    old = ring.current
    for i in range(5):
        _put(store, f"n{i}", value=f"value {i}".encode())
    assert store.rotate_keys(batch_size=2, max_batches=1) == 2
    assert set(ring.key_ids) == {old, ring.current}  # old key still needed
    assert _key_ids(store.path) == {old, ring.current}
    assert all(store.secret("c1", f"n{i}")[0] == f"value {i}".encode() for i in range(5))
    assert store.rotate_keys(new_key=False, batch_size=2) == 3
    assert ring.key_ids == (ring.current,) and _key_ids(store.path) == {ring.current}


def test_a_writer_with_a_stale_keyring_never_writes_under_a_retired_key(
    tmp_path: Path, store: Store, ring: KeyRing
) -> None:
    """Another process rotated and retired our current key: our next write uses the new key."""
    _put(store, value=b"v1")
    with Store.open(tmp_path, KeyRing.load_or_create(ring.path)) as other:
        assert other.rotate_keys() == 1
    _put(store, "later", value=b"v2")
    assert _key_ids(store.path) == {ring.current} and len(ring.key_ids) == 1
    assert store.secret("c1", "later") == (b"v2", 1) and store.secret("c1", "gh") == (b"v1", 1)


def test_no_plaintext_value_reaches_the_file_or_its_wal(tmp_path: Path, ring: KeyRing) -> None:
    forms = [CANARY, base64.b64encode(CANARY), CANARY.hex().encode(), CANARY.decode().encode("utf-16-le")]
    with Store.open(tmp_path, ring) as s:
        s.create_claim("c1", "agents")
        s.put_credential("c1", "gh", value=CANARY, hosts=["h"])
        s.patch_credential("c1", "gh", hosts=["h2"])
        s.put_credential("c1", "tmp", value=CANARY, hosts=["h"])
        s.delete_credential("c1", "tmp")
        s.rotate_keys()
        assert (tmp_path / f"{FILENAME}-wal").exists()
        blob = _files(tmp_path)
        assert not [f for f in forms if f in blob]
    blob = _files(tmp_path)  # after the checkpoint at close
    assert blob and not [f for f in forms if f in blob]


def test_one_of_a_hundred_concurrent_compare_and_sets_wins(
    tmp_path: Path, store: Store, ring: KeyRing
) -> None:
    v0 = _put(store).version
    barrier = threading.Barrier(100)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with Store.open(tmp_path, KeyRing.load_or_create(ring.path)) as s:
            barrier.wait()
            try:
                s.patch_credential("c1", "gh", value=f"writer {i}".encode(), if_match=v0)
                outcome = "ok"
            except PreconditionFailed as e:
                outcome = f"stale {e.current}"
            except Exception as e:
                outcome = f"error {e!r}"
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + [f"stale {v0 + 1}"] * 99
    value, version = store.secret("c1", "gh")
    assert version == v0 + 1 and value.startswith(b"writer ")


@pytest.mark.parametrize(
    ("version", "dropped"),
    [
        (1, ("basic_parts", "headers", "requests_used", "max_requests", "surfaces", "on_misplaced")),
        (2, ("basic_parts", "headers", "requests_used", "max_requests")),
        (3, ("basic_parts", "headers")),
        (4, ()),
    ],
    ids=["from-1", "from-2", "from-3", "from-4"],
)
def test_an_older_store_gains_the_budget_columns_and_keeps_its_data(
    tmp_path: Path, ring: KeyRing, version: int, dropped: tuple[str, ...]
) -> None:
    with Store.open(tmp_path, ring) as s:
        s.create_claim("c1", "agents")
        s.put_credential("c1", "gh", value=b"v1", hosts=["api.github.com"])
    db = _raw(tmp_path / FILENAME)  # back to that version's layout
    for column in dropped:
        db.execute(f"ALTER TABLE credentials DROP COLUMN {column}")
    db.execute("ALTER TABLE claims DROP COLUMN interface")  # schema 5
    db.execute(f"PRAGMA user_version = {version}")
    db.close()
    with Store.open(tmp_path, ring) as s:
        record = s.get_credential("c1", "gh")
        assert record is not None and (record.max_requests, record.requests_used) == (None, 0)
        assert (record.headers, record.basic_parts) == (None, None)  # the default slots
        assert s.secret("c1", "gh") == (b"v1", 1)
        s.patch_credential("c1", "gh", max_requests=1)
        assert s.spend("c1", "gh") and not s.spend("c1", "gh")
        assert s.get_claim("c1").interface is None  # type: ignore[union-attr]
    db = _raw(tmp_path / FILENAME)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        db.close()


@pytest.mark.parametrize(
    ("budget", "spends", "expected"),
    [(None, 3, [True, True, True]), (2, 3, [True, True, False]), (1, 2, [True, False])],
    ids=["no-budget", "two", "one"],
)
def test_spend_counts_up_to_the_budget(
    store: Store, budget: int | None, spends: int, expected: list[bool]
) -> None:
    _put(store, max_requests=budget)
    assert [store.spend("c1", "gh") for _ in range(spends)] == expected
    record = store.get_credential("c1", "gh")
    assert record is not None and record.requests_used == (0 if budget is None else budget)


def test_patch_keeps_the_count_and_put_restarts_it(store: Store) -> None:
    _put(store, max_requests=1)
    assert store.spend("c1", "gh") and not store.spend("c1", "gh")
    store.patch_credential("c1", "gh", value=b"v2")
    assert not store.spend("c1", "gh")  # a rotated value does not refill the budget
    store.patch_credential("c1", "gh", max_requests=2)
    assert store.spend("c1", "gh") and not store.spend("c1", "gh")
    _put(store, max_requests=1)  # a PUT replaces the credential: a fresh count
    assert store.spend("c1", "gh")


def test_spend_of_an_unknown_credential_is_refused(store: Store) -> None:
    assert store.spend("c1", "nothing") is False


def test_slots_are_stored_normalised_and_patched_back_to_the_default(store: Store) -> None:
    """Header slots are kept lower-cased and sorted, Basic parts in their fixed order; None is
    the default (proxy.core.slots), and a bad name is refused before anything is written."""
    _put(store)
    rec = store.patch_credential(
        "c1", "gh", headers=["X-Api-Key", "Authorization"], basic_parts=["password", "user"]
    )
    assert (rec.headers, rec.basic_parts) == (("authorization", "x-api-key"), ("user", "password"))
    again = store.get_credential("c1", "gh")
    assert again is not None and (again.headers, again.basic_parts) == (rec.headers, rec.basic_parts)
    for bad in ({"headers": ["Host"]}, {"headers": ["Proxy-Authorization"]}, {"headers": ["a b"]},
                {"basic_parts": ["realm"]}):  # fmt: skip
        with pytest.raises(ValueError):
            store.patch_credential("c1", "gh", **bad)
    back = store.patch_credential("c1", "gh", headers=None, basic_parts=None)
    assert (back.headers, back.basic_parts) == (None, None)
