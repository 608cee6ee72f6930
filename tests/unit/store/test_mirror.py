"""proxy.store.mirror: a store change costs the credentials it changed (issue 14).

Counted through the registry's own seam, ``Registry._credential`` (a store row → the core's
Credential): a write to one of a claim's 10,000 credentials calls it for that one, whether the
registry reads ``changes_since`` (PostgreSQL) or a whole snapshot (SQLite). Then, on both real
stores, what the next refresh after each kind of write must give: the patched value used at
once, a deleted credential's placeholder no longer the claim's (refused as forged), an added one
usable, the untouched credentials the same objects (their decrypted values kept), and a budget
(``max_requests``) neither reset nor lost by writes to other credentials."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import canary
import pytest

from proxy.core import placeholders
from proxy.core.forgery import find_forged
from proxy.core.policy import Policy
from proxy.store.base import Changes, ClaimRecord, CredentialRecord, CredentialStore
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store

MANY = 10_000


def _row(name: str, version: int = 1, hosts: tuple[str, ...] = ("api.test",)) -> CredentialRecord:
    return CredentialRecord(
        claim_id="big", name=name, hosts=hosts, inject_header=None, inject_format=None,
        placeholder=f"surr_{name:0>20}", version=version, created_at=1.0, updated_at=float(version),
        expires_at=None, last_used_at=None,
    )  # fmt: skip


def _counted(registry: Registry) -> list[str]:
    """Every credential row the registry turns into a Credential from now on, by name."""
    calls: list[str] = []
    build = registry._credential

    def spy(r: CredentialRecord, spec: dict[str, Any] | None) -> Any:
        calls.append(r.name)
        return build(r, spec)

    registry._credential = spy  # type: ignore[method-assign]
    return calls


CLAIM = ClaimRecord("big", "p", (), 1, 1.0, 1.0)
ROWS = [_row(f"k{n:05d}") for n in range(MANY)]
# each write as changes_since says it, and the rows a whole snapshot holds after it
WRITES: list[tuple[str, Changes, list[CredentialRecord]]] = [
    ("patch-value", Changes(2, [], [_row("k00007", 2)], [], [], {}),
     [_row("k00007", 2) if r.name == "k00007" else r for r in ROWS]),
    ("patch-metadata", Changes(2, [], [_row("k00007", 2, ("other.test",))], [], [], {}),
     [_row("k00007", 2, ("other.test",)) if r.name == "k00007" else r for r in ROWS]),
    ("add", Changes(2, [], [_row("new")], [], [], {}), [*ROWS, _row("new")]),
    ("delete", Changes(2, [], [], [], [("big", "k00007")], {}), [r for r in ROWS if r.name != "k00007"]),
]  # fmt: skip


@pytest.mark.parametrize("whole", [False, True], ids=["changes_since", "snapshot"])
@pytest.mark.parametrize(("what", "changes", "after"), WRITES, ids=[w[0] for w in WRITES])
def test_a_write_to_one_of_10000_credentials_builds_one_credential(
    tmp_path: Path, what: str, changes: Changes, after: list[CredentialRecord], whole: bool
) -> None:
    with Store.open(tmp_path, KeyRing.load_or_create(tmp_path / "k")) as store:
        registry = Registry(Policy("test", {}, {}), store)
        registry._apply(Changes(1, [CLAIM], ROWS, [], [], {}), True)
        before = registry.claim("big")
        assert before is not None and len(before.credentials) == MANY
        calls = _counted(registry)
        registry._apply(Changes(2, [CLAIM], after, [], [], {}) if whole else changes, whole)
        claim = registry.claim("big")
        assert claim is not None and claim is not before
        assert calls == ([] if what == "delete" else [changes.credentials[0].name])
        assert [c.name for c in claim.credentials] == sorted(r.name for r in after)
        kept = {c.name: c for c in before.credentials}
        assert sum(c is not kept.get(c.name) for c in claim.credentials) == (what != "delete")
        assert (b"surr_" + b"k00007".rjust(20, b"0") in claim.by_placeholder) == (what != "delete")


def test_a_snapshot_that_changed_nothing_keeps_every_claim_object(tmp_path: Path) -> None:
    """SQLite re-reads a whole snapshot on every write: claims it did not change keep their
    Claim (the scrubber keeps its compiled patterns for them), and nothing is built."""
    other = ClaimRecord("other", "p", (), 1, 1.0, 1.0)
    with Store.open(tmp_path, KeyRing.load_or_create(tmp_path / "k")) as store:
        registry = Registry(Policy("test", {}, {}), store)
        registry._apply(Changes(1, [CLAIM, other], ROWS[:100], [], [], {}), True)
        big, small = registry.claim("big"), registry.claim("other")
        calls = _counted(registry)
        gone = registry._apply(Changes(2, [CLAIM, other], ROWS[:100], [], [], {}), True)
        assert (registry.claim("big"), registry.claim("other"), calls, gone) == (big, small, [], set())
        assert registry.claim("big") is big


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CredentialStore]:
    if request.param == "sqlite":
        with Store.open(tmp_path, KeyRing.load_or_create(tmp_path / "k")) as s:
            yield s
        return
    from proxy.store.postgres import PostgresStore

    cluster = request.getfixturevalue("pg_cluster")
    with PostgresStore.open(cluster.database(), KeyRing.load_or_create(tmp_path / "k")) as p:
        yield p


def _value(registry: Registry, claim_id: str, placeholder: str) -> str | None:
    claim = registry.claim(claim_id)
    assert claim is not None
    cred = claim.by_placeholder.get(placeholder.encode())
    return None if cred is None else cred.secret()[0].reveal()


def test_the_next_refresh_after_each_write_sees_it_and_builds_only_it(store: CredentialStore) -> None:
    store.create_claim("c1", "p")
    values = [canary.make(f"mirror{n}") for n in range(60)]
    held = {
        f"k{n:02d}": store.put_credential("c1", f"k{n:02d}", value=v.encode(), hosts=["api.test"],
                                          max_requests=2 if n == 0 else None).placeholder
        for n, v in enumerate(values)
    }  # fmt: skip
    registry = Registry(Policy("test", {}, {}), store)
    registry.refresh()
    first = registry.claim("c1")
    assert first is not None and _value(registry, "c1", held["k05"]) == values[5]
    assert registry.spend(first, ["k00"]) is None  # one of the budget's two uses
    calls = _counted(registry)
    patched, added = canary.make("mirrorpatched"), canary.make("mirroradded")
    writes: list[tuple[Callable[[], object], list[str]]] = [
        (lambda: store.patch_credential("c1", "k05", value=patched.encode()), ["k05"]),
        (lambda: store.patch_credential("c1", "k06", hosts=["other.test"]), ["k06"]),
        (lambda: store.delete_credential("c1", "k07"), []),
        (lambda: store.put_credential("c1", "new", value=added.encode(), hosts=["api.test"]), ["new"]),
    ]
    for write, built in writes:
        calls.clear()
        write()
        registry.refresh()
        assert calls == built
    claim = registry.claim("c1")
    assert claim is not None
    assert _value(registry, "c1", held["k05"]) == patched  # the patched value, at once
    assert [str(h) for h in claim.by_placeholder[held["k06"].encode()].hosts] == ["other.test"]
    assert held["k07"].encode() not in claim.by_placeholder
    assert "k07" not in {c.name for c in claim.credentials}
    assert placeholders.has_valid_checksum(held["k07"])  # so a deleted one's is refused as forged
    assert find_forged([(b"authorization", f"Bearer {held['k07']}".encode())], b"/", claim.by_placeholder)
    new = store.get_credential("c1", "new")
    assert new is not None and _value(registry, "c1", new.placeholder) == added
    assert _value(registry, "c1", held["k08"]) == values[8]
    untouched = {c.name: c for c in first.credentials}
    assert [c.name for c in claim.credentials if c is not untouched.get(c.name)] == ["k05", "k06", "new"]
    # the budget: one use left after the writes to other credentials, then spent
    assert claim.metered == (untouched["k00"],)
    assert [registry.spend(claim, ["k00"]) for _ in range(2)] == [None, "k00"]
