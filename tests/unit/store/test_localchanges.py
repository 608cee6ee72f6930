"""proxy/store/localchanges.py: what a SQLite store's own writes touched is answered only when
every change after the reader's version is one of them, declared; else None (a snapshot)."""

from __future__ import annotations

from proxy.store.localchanges import LocalChanges


def _write(local: LocalChanges, pragma: int, *touch: tuple[str, str | None]) -> int:
    local.saw(pragma)  # the look inside BEGIN IMMEDIATE
    local.begin()
    for claim_id, name in touch:
        local.touch(claim_id, name)
    local.committed()
    return local.version


def test_own_declared_writes_are_answered_and_joined() -> None:
    local = LocalChanges()
    seen = local.saw(7)
    _write(local, 7, ("c", "a"))
    _write(local, 7, ("c", "b"), ("c", None))
    got = local.since(seen)
    assert got is not None and got.credentials == {("c", "a"), ("c", "b")} and got.claims == {"c"}
    assert local.since(local.version) is not None  # nothing since: an empty answer


def test_a_foreign_commit_seen_anywhere_after_the_readers_version_means_a_snapshot() -> None:
    local = LocalChanges()
    seen = local.saw(1)
    _write(local, 2, ("c", "a"))  # another connection committed before this write began
    assert local.since(seen) is None
    after = local.version
    assert local.since(after) is not None
    local.saw(3)  # seen by a data_version() call
    assert local.since(after) is None


def test_an_undeclared_write_a_future_version_and_a_pruned_journal_mean_a_snapshot() -> None:
    local = LocalChanges(keep=3)
    seen = local.saw(1)
    _write(local, 1)  # declared nothing (key rotation, a migration)
    assert local.since(seen) is None
    assert local.since(local.version + 1) is None
    mark = local.version
    for n in range(3):
        _write(local, 1, ("c", f"k{n}"))
    assert local.since(mark) is not None  # the three kept
    assert local.since(mark - 1) is None  # the one before them is no longer kept
    deleted = LocalChanges()
    at = deleted.saw(1)
    deleted.begin()
    deleted.touch("c", deleted=True)
    deleted.committed()
    got = deleted.since(at)
    assert got is not None and got.deleted_claims == {"c"}
