"""A control-API write costs the same on a claim of 10 credentials and of 10,000 (issue 19):
the placeholder uniqueness checks are index lookups (proxy/store/kinds.py ``_holder``), not a
read of the claim's rows, on every backend (the conformance fixtures: SQLite and PostgreSQL).

Counted at the seams, not timed: rows decoded (``rows.cred``), specs parsed
(``kinds.spec_placeholders``) and, on SQLite, the virtual machine's steps of the write."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from proxy.control.service import Control
from proxy.core.policy import Policy
from proxy.rules.loader import load_rules
from proxy.store import kinds, rows
from proxy.store.base import Conflict, CredentialStore
from proxy.store.keyring import KeyRing
from proxy.store.kinds import spec_json
from proxy.store.registry import Registry
from proxy.store.sqlite import Store
from unit.control.world import RULES, SECRET
from unit.store.test_conformance import Backend, backend

__all__ = ["backend"]  # the fixture, used by name

MANY = 240
AWS_SPEC = {"regions": ["us-east-1"], "services": ["s3"]}


def _fill(store: CredentialStore, claim_id: str, n: int) -> None:
    """``n`` credentials, every other one an aws_sigv4 with two spec placeholders."""
    store.create_claim(claim_id, "p")
    for i in range(n):
        name = f"k{i:05d}"
        if i % 2:
            spec = AWS_SPEC | {"secret_placeholder": f"surr_{claim_id}Sec{i:015d}",
                               "session_token_placeholder": f"surr_{claim_id}Tok{i:015d}"}  # fmt: skip
            store.put_credential(claim_id, name, value=b"{}", hosts=["api.test"], kind="aws_sigv4",
                                 spec=spec_json(spec))  # fmt: skip
        else:
            store.put_credential(claim_id, name, value=b"v", hosts=["api.test"])


def _body(kind: str, i: int) -> dict[str, Any]:
    if kind == "static":
        return {"hosts": ["api.test"], "value": SECRET}
    block = {"access_key_id": "AKIA" + "CANARYAKID0123", "secret_access_key": SECRET + "-aws",
             "regions": ["us-east-1"], "services": ["s3"],
             "secret_placeholder": f"surr_NewSecretPlaceholder{i:05d}"}  # fmt: skip
    return {"hosts": ["api.test"], "kind": "aws_sigv4", "aws_sigv4": block}


@pytest.mark.parametrize("kind", ["static", "aws_sigv4"])
def test_one_put_on_a_claim_of_many_credentials_reads_a_few_rows_not_the_claim(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    store = backend.open()
    _fill(store, "small", 2)
    _fill(store, "big", MANY)
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "tok").write_text("statictoken\n")
    control = Control(Registry(load_rules(tmp_path / "rules.yaml"), store), store)
    counts = {"decoded": 0, "specs": 0}

    def counted(what: str, real: Any) -> Any:
        def wrapper(*a: Any) -> Any:
            counts[what] += 1
            return real(*a)

        return wrapper

    monkeypatch.setattr(rows, "cred", counted("decoded", rows.cred))
    monkeypatch.setattr(kinds, "spec_placeholders", counted("specs", kinds.spec_placeholders))
    steps: dict[str, int] = {}
    for n, claim_id in enumerate(("small", "big", "big")):  # a create, then a replace
        db = getattr(store, "_db", None)  # SQLite: count the virtual machine's steps too
        ticks = [0]

        def tick(ticks: list[int] = ticks) -> int:
            ticks[0] += 1
            return 0

        if db is not None:
            db.set_progress_handler(tick, 1)
        counts.update(decoded=0, specs=0)
        record, _, _ = control.put_credential("test", claim_id, "new", _body(kind, n), None)
        if db is not None:
            db.set_progress_handler(None, 1)
        assert record.kind == kind
        # the old row, the record read back (a replace): never the claim's MANY
        assert counts["decoded"] <= 4, (claim_id, counts)
        assert counts["specs"] <= 4, (claim_id, counts)
        steps[f"{claim_id}{n}"] = ticks[0]
    if backend.kind == "sqlite":  # the same work on 2 + 1 credentials and on MANY + 1
        assert steps["big1"] < 1.5 * steps["small0"] + 500, steps


def test_a_store_written_before_the_spec_placeholder_table_is_filled_on_open(backend: Backend) -> None:
    """A store whose aws_sigv4 kinds were written by an older surrogate (no
    credential_spec_placeholders table) gets the table filled from the kinds when opened, so a
    spec placeholder taken then is still refused."""
    store = backend.open()
    _fill(store, "c", 2)
    taken = "surr_cSec000000000000001"
    drop = "DROP TABLE credential_spec_placeholders"
    if backend.kind == "sqlite":
        with closing(sqlite3.connect(backend.state / "store.sqlite3")) as db:
            db.execute(drop)
    else:
        with store._connection() as conn:  # type: ignore[attr-defined]
            conn.execute(drop.encode())
    reopened = backend.open()
    with pytest.raises(Conflict, match="'k00001'"):
        reopened.put_credential("c", "new", value=b"v", hosts=["api.test"], placeholder=taken)
    assert reopened.placeholder_holder("c", "new", {taken}) == (taken, "k00001")
    assert reopened.placeholder_holder("c", "k00001", {taken}) is None  # its own


def _decoding(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen = [0]
    real = rows.cred

    def counted(row: Any) -> Any:
        seen[0] += 1
        return real(row)

    monkeypatch.setattr(rows, "cred", counted)
    return seen


def test_the_writing_process_applies_its_own_write_and_still_sees_every_other_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite (proxy/store/localchanges.py): after a write of this process, its registry reads
    the rows the write touched, not a snapshot of the claim's MANY; a commit of another
    connection (another worker or process) is still seen, by a whole snapshot, including when
    this process writes after it and before the next refresh."""
    key = KeyRing.load_or_create(tmp_path / "k")
    with Store.open(tmp_path, key) as store, Store.open(tmp_path, key) as elsewhere:
        _fill(store, "big", MANY)
        registry = Registry(Policy("test", {}, {}), store)
        registry.refresh()
        decoded = _decoding(monkeypatch)
        writes: list[tuple[Any, set[str], int]] = [  # a write, the names after it, rows read at most
            (lambda: store.put_credential("big", "new", value=b"v", hosts=["api.test"]), {"new"}, 2),
            (lambda: store.patch_credential("big", "new", hosts=["x.test"]), {"new"}, 2),
            (lambda: store.delete_credential("big", "k00000"), {"new"}, 2),
            (lambda: elsewhere.put_credential("big", "far", value=b"v", hosts=["api.test"]), {"new", "far"},
             MANY + 2),  # another connection: a snapshot
            (lambda: (elsewhere.delete_credential("big", "far"),
                      store.put_credential("big", "near", value=b"v", hosts=["api.test"])),
             {"new", "near"}, MANY + 2),  # another's commit, then ours: still a snapshot
            (lambda: store.rotate_token("big"), {"new", "near"}, 2),
            (lambda: store.set_oauth("big", "near", {"token_url": "https://api.test/t"}), {"new", "near"}, 2),
        ]  # fmt: skip
        for write, names, most in writes:
            write()
            expected = {r.name for r in elsewhere.list_credentials("big")}  # the truth, read apart
            assert names <= expected
            decoded[0] = 0
            registry.refresh()
            claim = registry.claim("big")
            assert claim is not None and {c.name for c in claim.credentials} == expected
            assert decoded[0] <= most, (names, decoded[0])
        gone = store.delete_claim("big")
        assert gone and registry.refresh() == {"big"} and registry.claim("big") is None
        store.create_claim("big", "p")  # made again under its id: another claim, empty
        store.put_credential("big", "again", value=b"v", hosts=["api.test"])
        registry.refresh()
        claim = registry.claim("big")
        assert claim is not None and [c.name for c in claim.credentials] == ["again"]


def _aws(store: CredentialStore, claim_id: str, name: str, sec: str, tok: str | None = None) -> None:
    spec = AWS_SPEC | {"secret_placeholder": sec} | ({"session_token_placeholder": tok} if tok else {})
    store.put_credential(
        claim_id, name, value=b"{}", hosts=["api.test"], kind="aws_sigv4", spec=spec_json(spec)
    )


def test_the_indexed_placeholder_check_follows_changes_deletes_and_kinds(backend: Backend) -> None:
    """Review r-perf: the side table of spec placeholders must follow every write, on both
    backends: a spec placeholder taken by another credential (as a spec's or as a placeholder)
    is refused; a PUT changing a spec frees the old ones; a deleted credential, a credential
    turned static and a deleted claim free theirs; another claim is not checked."""
    store = backend.open()
    store.create_claim("c", "p")
    store.create_claim("d", "p")
    _aws(store, "c", "a", "surr_SpecSecretPlaceholder0001", "surr_SpecTokenPlaceholder00001")
    for taken in ("surr_SpecSecretPlaceholder0001", "surr_SpecTokenPlaceholder00001"):
        with pytest.raises(Conflict):
            _aws(store, "c", "b", taken)
        with pytest.raises(Conflict):
            store.put_credential("c", "b", value=b"v", hosts=["api.test"], placeholder=taken)
    _aws(store, "d", "b", "surr_SpecSecretPlaceholder0001")  # another claim: not checked
    _aws(store, "c", "a", "surr_SpecSecretPlaceholder0002")  # the spec changed: both old ones free
    _aws(store, "c", "b", "surr_SpecSecretPlaceholder0001", "surr_SpecTokenPlaceholder00001")
    with pytest.raises(Conflict):
        _aws(store, "c", "x", "surr_SpecSecretPlaceholder0002")
    assert store.delete_credential("c", "a")
    _aws(store, "c", "x", "surr_SpecSecretPlaceholder0002")  # freed by the delete
    store.put_credential("c", "b", value=b"v", hosts=["api.test"])  # turned static: frees its spec's
    _aws(store, "c", "y", "surr_SpecSecretPlaceholder0001", "surr_SpecTokenPlaceholder00001")
    store.delete_claim("c")
    store.create_claim("c", "p")
    _aws(store, "c", "z", "surr_SpecSecretPlaceholder0002")  # the claim's rows went with it
