"""Every store backend keeps every promise of :class:`proxy.store.base.CredentialStore`.

Each test runs on the SQLite store (a temp file) and on the PostgreSQL store (a fresh database in
the session's private cluster, tests/pg.py; skipped, saying why, only where the server binaries
are absent). ``other()`` opens a second handle on the same store: another process's view (for
SQLite another connection to the file, for PostgreSQL another pool), so visibility and atomicity
are checked across handles, not within one.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import canary
import pytest

from proxy.store.base import (
    HISTORY_VERSIONS,
    Conflict,
    CredentialStore,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from proxy.store.choose import open_store
from proxy.store.keyring import DecryptError, KeyRing

ROOT = Path(__file__).resolve().parents[3]
SECRET = canary.make("conform").encode()
BACKENDS = ["sqlite", "postgresql"]


class Backend:
    def __init__(self, kind: str, state: Path, url: str | None, at_rest: Callable[[], bytes]) -> None:
        self.kind, self.state, self.url, self.at_rest = kind, state, url, at_rest
        self.opened: list[CredentialStore] = []

    def open(self) -> CredentialStore:
        store = open_store(self.state, self.url, self.state / "store.key")
        self.opened.append(store)
        return store


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    state = tmp_path / "state"
    state.mkdir()
    if request.param == "sqlite":
        files = [state / f"store.sqlite3{s}" for s in ("", "-wal", "-shm")]
        b = Backend("sqlite", state, None, lambda: b"".join(p.read_bytes() for p in files if p.exists()))
    else:
        cluster = request.getfixturevalue("pg_cluster")
        url = cluster.database()
        b = Backend("postgresql", state, url, lambda: cluster.dump(url))
    yield b
    for s in b.opened:
        s.close()


@pytest.fixture
def store(backend: Backend) -> CredentialStore:
    s = backend.open()
    s.create_claim("c1", "agents")
    return s


@pytest.fixture
def other(backend: Backend, store: CredentialStore) -> Callable[[], CredentialStore]:
    return backend.open


def _put(store: CredentialStore, name: str = "gh", value: bytes = b"v1", **kw: Any) -> Any:
    return store.put_credential("c1", name, value=value, hosts=kw.pop("hosts", ["api.github.com"]), **kw)


# --- claims and tokens ----------------------------------------------------------------------


def test_claims_are_created_listed_by_id_and_deleted_with_their_credentials(store: CredentialStore) -> None:
    claim, token = store.create_claim("B2", "ci", ["10.0.0.7", "10.1.2.3/16"], "veth0")
    assert (claim.id, claim.pool, claim.version, claim.interface) == ("B2", "ci", 1, "veth0")
    assert claim.sources == ("10.0.0.7/32", "10.1.0.0/16") and token not in repr(claim)
    assert store.get_claim("B2") == claim and store.get_claim("nope") is None
    assert [c.id for c in store.list_claims()] == ["B2", "c1"]  # byte order, as SQLite sorts
    store.put_credential("B2", "k", value=b"x", hosts=["h"])
    store.set_oauth("B2", "k", {"token_url": "https://h/t"})
    assert store.delete_claim("B2") is True and store.delete_claim("B2") is False
    assert store.list_credentials("B2") == [] and store.oauth_specs() == {}
    with pytest.raises(Conflict, match="'c1' already exists"):
        store.create_claim("c1", "agents")


@pytest.mark.parametrize(
    ("claim_id", "sources", "interface", "error"),
    [("", (), None, ValueError), ("a\0b", (), None, ValueError), ("c9", ["nope"], None, ValueError),
     ("c9", "10.0.0.1", None, TypeError), ("c9", (), "veth0", ValueError),
     ("c9", ["10.0.0.1"], "bad name!", ValueError)],
    ids=["empty-id", "nul-id", "bad-source", "sources-str", "interface-without-sources", "bad-interface"],
)  # fmt: skip
def test_bad_claims_are_refused_before_anything_is_written(
    store: CredentialStore, claim_id: str, sources: Any, interface: str | None, error: type[Exception]
) -> None:
    version = store.data_version()
    with pytest.raises(error):
        store.create_claim(claim_id, "p", sources, interface)
    assert [c.id for c in store.list_claims()] == ["c1"] and store.data_version() == version


def test_a_rotated_token_replaces_the_old_one_at_once_on_every_handle(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    _, old = store.create_claim("c2", "ci")
    peer = other()
    assert peer.check_token("c2", old) and not peer.check_token("c2", old + "x")
    assert not peer.check_token("nope", old)
    claim, new = store.rotate_token("c2")
    assert claim.version == 2 and new != old
    assert peer.check_token("c2", new) and not peer.check_token("c2", old)
    with pytest.raises(NotFound):
        store.rotate_token("nope")


# --- credentials: versions, compare-and-set, history ------------------------------------------


def test_put_patch_and_delete_move_versions_and_keep_the_value_sealed(store: CredentialStore) -> None:
    rec = _put(store, value=SECRET, max_requests=3, headers=["X-Key"], surfaces=["basic", "header"])
    assert (rec.version, rec.headers, rec.surfaces) == (1, ("x-key",), ("header", "basic"))
    assert store.secret("c1", "gh") == (SECRET, 1)
    assert store.spend("c1", "gh")
    patched = store.patch_credential("c1", "gh", hosts=["a.example"])
    assert (patched.version, patched.requests_used, patched.created_at) == (2, 1, rec.created_at)
    assert store.secret("c1", "gh") == (SECRET, 2)  # re-sealed under version 2's associated data
    assert store.patch_credential("c1", "gh") == patched  # an empty patch changes nothing
    replaced = _put(store, value=b"v2", max_requests=3)
    assert (replaced.version, replaced.requests_used) == (3, 0)  # a PUT starts the count again
    assert store.get_credential("c1", "gh") == replaced == store.list_credentials("c1")[0]
    assert store.delete_credential("c1", "gh") is True and store.delete_credential("c1", "gh") is False
    with pytest.raises(NotFound):
        store.secret("c1", "gh")


def test_compare_and_set_names_the_current_version(store: CredentialStore) -> None:
    with pytest.raises(PreconditionFailed) as absent:
        _put(store, if_match=1)
    assert absent.value.current is None
    _put(store)
    with pytest.raises(PreconditionFailed) as stale:
        store.patch_credential("c1", "gh", value=b"x", if_match=7)
    assert stale.value.current == 1
    with pytest.raises(PreconditionFailed):
        store.delete_credential("c1", "gh", if_match=2)
    assert store.patch_credential("c1", "gh", value=b"v2", if_match=1).version == 2
    assert store.delete_credential("c1", "gh", if_match=2) is True


@pytest.mark.parametrize(
    ("change", "error"),
    [({"surfaces": ["cookie-jar"]}, ValueError), ({"headers": ["Host"]}, ValueError),
     ({"basic_parts": ["realm"]}, ValueError), ({"on_misplaced": "explode"}, ValueError),
     ({"placeholder": "not-a-placeholder"}, ValueError), ({"hosts": "h"}, TypeError),
     ({"value": "text"}, TypeError), ({"value": None}, ValueError), ({"pool": "x"}, TypeError)],
    ids=["surface", "header", "basic-part", "on-misplaced", "placeholder", "hosts-str", "value-str",
         "value-cleared", "unknown-field"],
)  # fmt: skip
def test_a_refused_change_writes_nothing(store: CredentialStore, change: dict[str, Any], error: type) -> None:
    before = _put(store, value=SECRET)
    version = store.data_version()
    with pytest.raises(error) as raised:
        store.patch_credential("c1", "gh", **change)
    assert SECRET.decode() not in str(raised.value)
    assert store.get_credential("c1", "gh") == before and store.secret("c1", "gh") == (SECRET, 1)
    assert store.previous_secrets("c1", "gh") == [] and store.data_version() == version


def test_a_taken_placeholder_is_a_conflict_naming_its_owner_never_a_value(store: CredentialStore) -> None:
    first = _put(store, "a", value=SECRET)
    _put(store, "b", value=b"other")
    with pytest.raises(Conflict) as raised:
        store.patch_credential("c1", "b", placeholder=first.placeholder)
    assert "'a' of claim 'c1'" in str(raised.value) and SECRET.decode() not in str(raised.value)
    with pytest.raises(NotFound):
        store.put_credential("nope", "x", value=b"x", hosts=["h"])


def test_replaced_values_are_kept_newest_first_and_bounded(store: CredentialStore) -> None:
    for n in range(HISTORY_VERSIONS + 3):
        _put(store, value=b"value %d" % n)
    store.patch_credential("c1", "gh", hosts=["other.example"])  # metadata only: no history row
    kept = store.previous_secrets("c1", "gh")
    assert [v for v, _, _ in kept] == [b"value %d" % n for n in range(HISTORY_VERSIONS + 1, 1, -1)]
    assert [ver for _, ver, _ in kept] == list(range(HISTORY_VERSIONS + 2, 2, -1))
    assert all(abs(at - time.time()) < 60 for _, _, at in kept)


def test_oauth_specs_are_set_cleared_and_refused_for_an_unknown_credential(store: CredentialStore) -> None:
    _put(store)
    store.set_oauth("c1", "gh", {"token_url": "https://h/t", "fields": ["a"]})
    assert store.oauth_specs() == {("c1", "gh"): {"token_url": "https://h/t", "fields": ["a"]}}
    store.set_oauth("c1", "gh", None)
    assert store.oauth_specs() == {}
    with pytest.raises(NotFound):
        store.set_oauth("c1", "nope", {})


# --- visibility, atomicity, concurrency across handles ----------------------------------------


def test_every_write_moves_data_version_for_another_handle(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    peer = other()
    writes: list[Callable[[], object]] = [
        lambda: _put(store), lambda: store.patch_credential("c1", "gh", hosts=["x.example"]),
        lambda: store.set_oauth("c1", "gh", {"a": 1}), lambda: store.rotate_keys(),
        lambda: store.create_claim("c2", "p"), lambda: store.rotate_token("c2"),
        lambda: store.delete_credential("c1", "gh"), lambda: store.delete_claim("c2"),
    ]  # fmt: skip
    for write in writes:
        seen = peer.data_version()
        write()
        assert peer.data_version() != seen
    claims, creds = peer.snapshot()
    assert [c.id for c in claims] == ["c1"] and creds == []


def test_of_many_concurrent_compare_and_sets_exactly_one_wins(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    v0 = _put(store).version
    handles = [other() for _ in range(4)]
    barrier = threading.Barrier(24)
    outcomes: list[str] = []

    def writer(i: int) -> None:
        barrier.wait()
        try:
            handles[i % 4].patch_credential("c1", "gh", value=b"writer %d" % i, if_match=v0)
            outcomes.append("ok")
        except PreconditionFailed as e:
            outcomes.append(f"stale {e.current}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok"] + [f"stale {v0 + 1}"] * 23
    assert store.secret("c1", "gh")[1] == v0 + 1


@pytest.mark.parametrize("kind", ["store", "rules"])
def test_a_budget_of_n_is_spent_exactly_n_times_by_concurrent_handles(
    store: CredentialStore, other: Callable[[], CredentialStore], kind: str
) -> None:
    budget, tries = 7, 40
    _put(store, max_requests=budget)
    handles = [other() for _ in range(4)]
    barrier = threading.Barrier(tries)
    wins: list[bool] = []

    def spender(i: int) -> None:
        s = handles[i % 4]
        barrier.wait()
        if kind == "store":
            wins.append(s.spend("c1", "gh"))
        else:
            wins.append(s.spend_rules_budgets("rc", [("a", budget), ("b", 100)]) is None)

    threads = [threading.Thread(target=spender, args=(i,)) for i in range(tries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == budget
    if kind == "store":
        assert store.get_credential("c1", "gh").requests_used == budget  # type: ignore[union-attr]
    else:  # all or none: "b" was counted only with "a"
        assert store.spend_rules_budgets("rc", [("b", budget)]) == "b"
        assert store.spend_rules_budgets("rc", [("b", budget + 1)]) is None


def test_spend_refuses_unknown_and_spent_credentials_and_counts_nothing_unmetered(
    store: CredentialStore,
) -> None:
    assert store.spend("c1", "nothing") is False
    _put(store)
    assert all(store.spend("c1", "gh") for _ in range(3))
    assert store.get_credential("c1", "gh").requests_used == 0  # type: ignore[union-attr]
    assert store.spend_rules_budgets("rc", [("z", 0)]) == "z"


def test_touch_used_records_a_use_at_most_once_a_second(store: CredentialStore) -> None:
    _put(store)
    store.touch_used("c1", "gh", 1000.0)
    store.touch_used("c1", "gh", 1000.5)
    assert store.get_credential("c1", "gh").last_used_at == 1000.0  # type: ignore[union-attr]
    store.touch_used("c1", "gh", 1002.0)
    assert store.get_credential("c1", "gh").last_used_at == 1002.0  # type: ignore[union-attr]


# --- sealing and keys -------------------------------------------------------------------------


def test_no_value_is_at_rest_in_plaintext(backend: Backend, store: CredentialStore) -> None:
    forms = [SECRET, base64.b64encode(SECRET), SECRET.hex().encode()]
    _put(store, value=SECRET)
    store.patch_credential("c1", "gh", value=b"next")  # the secret now lives in the history
    _put(store, "tmp", value=SECRET)
    store.delete_credential("c1", "tmp")
    store.rotate_keys()
    blob = backend.at_rest()
    assert blob and not [f for f in forms if f in blob]


def test_a_sealed_value_moved_to_another_row_does_not_decrypt(store: CredentialStore) -> None:
    _put(store, "a", value=SECRET)
    _put(store, "b", value=b"other")
    with store._write() as db:  # type: ignore[attr-defined]  # the shared queries' connection
        db.execute(
            "UPDATE credentials SET value = (SELECT value FROM credentials WHERE name = ?), "
            "key_id = (SELECT key_id FROM credentials WHERE name = ?) WHERE name = ?",
            ("a", "a", "b"),
        )
    with pytest.raises(DecryptError) as raised:
        store.secret("c1", "b")
    assert SECRET.decode() not in str(raised.value)


def test_key_rotation_re_seals_everything_resumably_and_retires_the_old_key(
    backend: Backend, store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    for n in range(5):
        _put(store, f"k{n}", value=b"value %d" % n)
        _put(store, f"k{n}", value=b"again %d" % n)
    old = KeyRing.load_or_create(backend.state / "store.key").current
    assert store.rotate_keys(batch_size=2, max_batches=1) == 4  # type: ignore[call-arg]
    assert old in KeyRing.load_or_create(backend.state / "store.key").key_ids  # still needed
    assert store.rotate_keys(new_key=False) == 6
    ring = KeyRing.load_or_create(backend.state / "store.key")
    assert old not in ring.key_ids and len(ring.key_ids) == 1
    peer = other()
    assert [peer.secret("c1", f"k{n}")[0] for n in range(5)] == [b"again %d" % n for n in range(5)]
    assert [v for v, _, _ in peer.previous_secrets("c1", "k0")] == [b"value 0"]


# --- durability -------------------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from proxy.store.choose import open_store

state, url = Path(sys.argv[1]), (sys.argv[2] or None)
with open_store(state, url, state / "store.key") as store:
    current = store.get_credential("c1", "gh")
    n = current.version if current else 0
    while True:
        n += 1
        rec = store.put_credential("c1", "gh", value=b"value %d" % n, hosts=["api.github.com"])
        assert rec.version == n, (rec.version, n)
        print("ACK", n, flush=True)
"""


def test_acknowledged_writes_survive_kill_9_of_the_writer(backend: Backend, store: CredentialStore) -> None:
    acked = 0
    for stop_after in (7, 23, 41):
        args = [sys.executable, "-c", WRITER, str(backend.state), backend.url or ""]
        with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
            assert child.stdout is not None
            for _ in range(stop_after):
                line = child.stdout.readline()
                assert line.startswith("ACK "), f"writer died early: {line!r}"
                acked = int(line.split()[1])
            time.sleep((stop_after % 5) / 1000)  # land the kill somewhere in the next write
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        with open_store(backend.state, backend.url, backend.state / "store.key") as fresh:
            value, version = fresh.secret("c1", "gh")
        assert version >= acked and value == b"value %d" % version


def test_a_store_error_is_a_surrogate_error(store: CredentialStore) -> None:
    from proxy.core.errors import SurrogateError

    assert issubclass(StoreError, SurrogateError) and issubclass(NotFound, StoreError)
