"""Incremental re-reads (PostgreSQL's ``changes_since``): after every kind of write, a registry
that applied only the changes holds exactly what a registry built from a whole snapshot holds,
reports the same claims gone, and never read a snapshot to get there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg import Cluster

from proxy.core.policy import Claim, Policy
from proxy.store import pgschema
from proxy.store.keyring import KeyRing
from proxy.store.postgres import PostgresStore
from proxy.store.registry import Registry


def _view(registry: Registry) -> dict[str, Any]:
    """Every store claim as plain values: what the proxy decides on."""

    def claim(c: Claim) -> tuple[Any, ...]:
        creds = tuple(
            (cr.name, cr.placeholder, tuple(map(str, cr.hosts)), cr.inject, cr.expires_at,
             cr.source.current()[0].reveal(), cr.source.current()[1],
             cr.max_requests, tuple(sorted(cr.surfaces)), cr.on_misplaced, cr.oauth,
             tuple(sorted(cr.headers)), tuple(sorted(cr.basic_parts)))
            for cr in c.credentials
        )  # fmt: skip
        return (c.pool, tuple(map(str, c.sources)), c.interface, creds, registry.generation(c.id))

    return {cid: claim(c) for cid, c in sorted(registry._store_claims.items())}


@pytest.fixture
def store(pg_cluster: Cluster, tmp_path: Path) -> Iterator[PostgresStore]:
    with PostgresStore.open(pg_cluster.database(), KeyRing.load_or_create(tmp_path / "k")) as s:
        yield s


OAUTH = {"token_endpoint": {"host": "api.test", "path": "/token"}, "access_token": "k9"}

WRITES: list[tuple[str, Callable[[PostgresStore], object]]] = [
    ("create-claim", lambda s: s.create_claim("c2", "p", ["10.0.0.2"])),
    ("put", lambda s: s.put_credential("c1", "a", value=b"va", hosts=["api.test"])),
    ("patch-metadata", lambda s: s.patch_credential("c1", "k3", hosts=["other.test"], max_requests=4)),
    ("patch-value", lambda s: s.patch_credential("c1", "k4", value=b"new")),
    ("replace", lambda s: s.put_credential("c1", "k5", value=b"v", hosts=["api.test"], surfaces=["basic"])),
    ("oauth-set", lambda s: s.set_oauth("c1", "k6", OAUTH)),
    ("oauth-cleared", lambda s: s.set_oauth("c1", "k8", None)),
    ("rotate-token", lambda s: s.rotate_token("c1")),
    ("delete-credential", lambda s: s.delete_credential("c1", "k7")),
    ("delete-claim", lambda s: s.delete_claim("c1")),
    ("recreate-claim", lambda s: (s.delete_claim("c2"), s.create_claim("c2", "p"))),
    # deleted and created again under the same name: version 1 again, but another credential
    ("recreate-credential", lambda s: (s.delete_credential("c1", "k1"),
                                       s.put_credential("c1", "k1", value=b"other", hosts=["new.test"]))),
    ("recreate-claim-and-credential", lambda s: (
        s.delete_claim("c1"), s.create_claim("c1", "p"),
        s.put_credential("c1", "k1", value=b"x", hosts=["new.test"]))),
    ("rotate-keys", lambda s: s.rotate_keys()),
]  # fmt: skip


@pytest.mark.parametrize(("what", "write"), WRITES, ids=[w for w, _ in WRITES])
def test_a_registry_fed_only_changes_equals_one_built_from_a_snapshot(
    store: PostgresStore, what: str, write: Callable[[PostgresStore], object]
) -> None:
    store.create_claim("c1", "p", ["10.0.0.1"], "veth0")
    for n in range(40):
        store.put_credential("c1", f"k{n}", value=b"v%d" % n, hosts=["api.test"], max_requests=n or None)
    store.set_oauth("c1", "k8", OAUTH)
    incremental = Registry(Policy("test", {}, {}), store)
    incremental.refresh()  # the first build: a whole snapshot
    snapshots: list[int] = []
    whole = store.snapshot
    store.snapshot = lambda: (snapshots.append(1), whole())[1]  # type: ignore[method-assign]
    before = _view(incremental)
    write(store)
    gone = incremental.refresh()
    store.snapshot = whole  # type: ignore[method-assign]
    fresh = Registry(Policy("test", {}, {}), store)
    fresh.refresh()
    assert snapshots == []  # the changes alone
    assert _view(incremental) == _view(fresh)
    assert (_view(fresh) == before) == (what == "rotate-keys")  # re-sealed values read the same
    expected_gone = {cid for cid in before if before[cid][4] != _view(fresh).get(cid, (None,) * 5)[4]}
    if what in ("delete-credential", "recreate-credential"):
        expected_gone.add("c1")  # a credential deleted closes its claim's tunnels (issue 14)
    assert gone == expected_gone
    assert incremental.claim_for_source("10.0.0.1") == fresh.claim_for_source("10.0.0.1")


def test_one_write_among_many_credentials_reads_one_row(store: PostgresStore) -> None:
    store.create_claim("c1", "p")
    for n in range(300):
        store.put_credential("c1", f"k{n}", value=b"v", hosts=["api.test"])
    seen = store.data_version()
    store.patch_credential("c1", "k7", hosts=["other.test"])
    changes = store.changes_since(seen)
    assert changes is not None and [r.name for r in changes.credentials] == ["k7"]
    assert changes.claims == [] and changes.removed_credentials == [] and changes.version == seen + 1


def test_a_reader_behind_the_pruned_tombstones_reads_a_snapshot(store: PostgresStore) -> None:
    store.create_claim("c1", "p")
    with store._write() as db:
        db.execute("UPDATE surrogate_state SET pruned_through = data_version")
    assert store.changes_since(0) is None
    assert store.changes_since(store.data_version() + 5) is None  # a database older than the reader
    registry = Registry(Policy("test", {}, {}), store)
    registry.refresh()
    registry._seen = 0  # as if it had last synced long ago
    store.create_claim("c2", "p")
    registry.refresh()
    assert sorted(registry._store_claims) == ["c1", "c2"]


def test_a_version_1_database_is_migrated_and_keeps_its_rows(pg_cluster: Cluster, tmp_path: Path) -> None:
    url = pg_cluster.database()
    db = url.split("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(pg_cluster.url_params(db), autocommit=True) as conn:
        for statement in pgschema.SCHEMA:  # the layout of schema version 1
            conn.execute(statement.encode())
        conn.execute("INSERT INTO claims VALUES ('old', 'p', '[]', %s, 3, 1.0, 2.0, NULL)", (b"\0" * 32,))
    with PostgresStore.open(url, KeyRing.load_or_create(tmp_path / "k")) as s:
        old = s.get_claim("old")
        assert old is not None and old.version == 3
        seen = s.data_version()
        s.create_claim("new", "p")
        changes = s.changes_since(seen)
        assert changes is not None and [c.id for c in changes.claims] == ["new"]
    with psycopg.connect(pg_cluster.url_params(db), autocommit=True) as conn:
        row = conn.execute("SELECT schema_version FROM surrogate_state").fetchone()
        assert row == (pgschema.SCHEMA_VERSION,)


def test_a_credential_created_again_is_rebuilt_from_a_whole_snapshot_too(tmp_path: Path) -> None:
    """The SQLite store (whole snapshots): deleted and created again, a credential is at version 1
    again, yet the registry must not keep the old one's hosts, placeholder or decrypted value."""
    from proxy.store.sqlite import open_state_store

    with open_state_store(tmp_path / "state") as store:
        store.create_claim("c1", "p")
        store.put_credential("c1", "k", value=b"old", hosts=["old.test"])
        registry = Registry(Policy("test", {}, {}), store)
        registry.refresh()
        before = _view(registry)
        store.delete_credential("c1", "k")
        store.put_credential("c1", "k", value=b"new", hosts=["new.test"])
        registry.refresh()
        fresh = Registry(Policy("test", {}, {}), store)
        fresh.refresh()
        assert _view(registry) == _view(fresh) != before


def test_a_database_without_its_state_row_is_a_store_error_and_the_index_is_kept(
    pg_cluster: Cluster, store: PostgresStore
) -> None:
    """A database that lies (its one row of state deleted by hand): every read that needs the
    row says so as a StoreError, which the registry survives on its last index; no TypeError
    escapes into the request path."""
    from proxy.store.base import StoreError

    store.create_claim("c1", "p")
    registry = Registry(Policy("test", {}, {}), store)
    registry.refresh()
    seen = store.data_version()
    store.create_claim("c2", "p")
    with store._connection() as conn:
        conn.execute("DELETE FROM surrogate_state")
    for read in (store.data_version, lambda: store.changes_since(seen)):
        with pytest.raises(StoreError, match="surrogate_state"):
            read()
    assert registry.refresh() == set() and sorted(registry._store_claims) == ["c1"]
