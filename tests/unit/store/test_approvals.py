"""Every store backend keeps the approvals' promises (issue 16): a pending approval is decided
once (compare-and-set, across handles), a grant matches only what it was given, survives a
reopen, expires and is revoked. Runs on SQLite and PostgreSQL (the conformance fixtures)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from proxy.store.base import ApprovalRecord, Conflict, CredentialStore, GrantRecord, NotFound, new_id
from tests.unit.store import test_conformance as conformance
from tests.unit.store.test_conformance import Backend

backend, store, other = conformance.backend, conformance.store, conformance.other  # both backends

NOW = time.time()


def _approval(**kw: object) -> ApprovalRecord:
    base = ApprovalRecord(
        id=secrets.token_urlsafe(16), claim_id="c1", pool="agents", method="POST", host="api.example.com",
        port=443, path="/v1/items?x=1", credentials=("gh",), preview='{"a": 1}', rule="rules.yaml:3",
        scopes=("once", "session", "for", "always"), created_at=NOW, expires_at=NOW + 60, session="run:1",
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def _grant(**kw: object) -> GrantRecord:
    base = GrantRecord(
        id=secrets.token_urlsafe(16), claim_id="c1", credentials=("gh",), method="POST",
        host="api.example.com", port=443, path_prefix="/v1/items", scope="always", created_at=NOW,
        expires_at=None, approved_by="operator",
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def test_an_approval_is_listed_pending_then_decided_once(store: CredentialStore) -> None:
    a = _approval()
    store.add_approval(a)
    assert store.approvals() == [a] and store.approval(a.id) == a and store.approval("x" * 22) is None
    done = store.decide_approval(a.id, "approve", "for:10m", "op", NOW + 1)
    assert (done.state, done.scope, done.decided_by, done.decided_at) == (
        "approved",
        "for:600",
        "op",
        NOW + 1,
    )
    assert (
        store.approvals() == [] and store.approvals("approved") == [done] and store.approvals(None) == [done]
    )
    with pytest.raises(Conflict, match="no longer pending .it is approved"):
        store.decide_approval(a.id, "deny", None, "op2", NOW + 2)
    with pytest.raises(Conflict):
        store.add_approval(a)
    with pytest.raises(NotFound):
        store.decide_approval("y" * 22, "deny", None, "op", NOW)


@pytest.mark.parametrize(
    ("verdict", "scope"),
    [
        ("maybe", None),
        ("approve", "forever"),
        ("approve", "for:0"),
        ("approve", "for:99d"),
        ("approve", "always"),
    ],
    ids=["bad-verdict", "bad-scope", "zero-duration", "too-long", "not-offered"],
)
def test_a_bad_decision_is_refused_and_leaves_it_pending(
    store: CredentialStore, verdict: str, scope: str
) -> None:
    a = _approval(scopes=("once", "for"))
    store.add_approval(a)
    with pytest.raises(ValueError):
        store.decide_approval(a.id, verdict, scope, "op", NOW)
    assert store.approval(a.id) == a


def test_of_concurrent_deciders_on_many_handles_exactly_one_wins(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    a = _approval()
    store.add_approval(a)
    handles = [other() for _ in range(6)]
    outcomes: list[str] = []

    def decide(s: CredentialStore, i: int) -> None:
        try:
            s.decide_approval(a.id, "approve" if i % 2 else "deny", None, f"op{i}", NOW + 1)
            outcomes.append("won")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=decide, args=(s, i)) for i, s in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 5 + ["won"]
    assert store.approval(a.id).state in ("approved", "denied")  # type: ignore[union-attr]


def test_a_timed_out_or_withdrawn_approval_cannot_be_decided(store: CredentialStore) -> None:
    late, gone = _approval(), _approval()
    store.add_approval(late)
    store.add_approval(gone)
    with pytest.raises(Conflict, match="timed out"):
        store.decide_approval(late.id, "approve", None, "op", NOW + 61)  # past expires_at
    closed = store.withdraw_approval(gone.id, "client went away")
    assert closed is not None and (closed.state, closed.reason) == ("withdrawn", "client went away")
    assert store.withdraw_approval(gone.id, "again") is None
    with pytest.raises(Conflict, match="withdrawn"):
        store.decide_approval(gone.id, "approve", None, "op", NOW)
    timed = store.withdraw_approval(late.id, "timeout", state="timed_out")
    assert timed is not None and timed.state == "timed_out"


def test_a_grant_matches_only_its_claim_host_method_port_path_and_credentials(store: CredentialStore) -> None:
    g = _grant()
    store.add_grant(g)

    def match(**kw: object) -> GrantRecord | None:
        args = {"claim": "c1", "host": "api.example.com", "method": "POST", "path": "/v1/items",
                "credential_names": ["gh"], "now": NOW + 1, "port": 443, **kw}  # fmt: skip
        return store.matching_grant(**args)  # type: ignore[arg-type]

    assert match() == g and match(path="/v1/items/7?q=1") == g and match(credential_names=[]) == g
    for kw in ({"claim": "c2"}, {"host": "evil.example.com"}, {"host": "x.api.example.com"},
               {"method": "DELETE"}, {"port": 8443}, {"path": "/v1/itemsx"}, {"path": "/v1"},
               {"path": "/v1/items/../admin"}, {"credential_names": ["gh", "aws"]}):  # fmt: skip
        assert match(**kw) is None, kw


def test_grants_expire_are_scoped_to_a_session_and_revoked(store: CredentialStore) -> None:
    timed = _grant(scope="for", expires_at=NOW + 600)
    session = _grant(scope="session", session="run:1", path_prefix="/s", created_at=NOW + 0.5)
    store.add_grant(timed)
    store.add_grant(session)
    m = store.matching_grant
    assert m("c1", "api.example.com", "POST", "/v1/items", ["gh"], NOW + 599) == timed
    assert m("c1", "api.example.com", "POST", "/v1/items", ["gh"], NOW + 600) is None
    assert m("c1", "api.example.com", "POST", "/s", ["gh"], NOW, session="run:1") == session
    assert m("c1", "api.example.com", "POST", "/s", ["gh"], NOW, session="run:2") is None
    assert m("c1", "api.example.com", "POST", "/s", ["gh"], NOW) is None
    assert [g.id for g in store.grants(NOW + 1)] == [timed.id, session.id]
    assert [g.id for g in store.grants(NOW + 601)] == [session.id]
    store.revoke_grant(session.id, "op")
    store.revoke_grant(session.id, "op2")
    (revoked,) = [g for g in store.grants() if g.id == session.id]
    assert revoked.revoked_by == "op" and revoked.revoked_at is not None
    assert m("c1", "api.example.com", "POST", "/s", ["gh"], NOW, session="run:1") is None
    with pytest.raises(NotFound):
        store.revoke_grant("z" * 22, "op")
    with pytest.raises(ValueError):
        store.add_grant(_grant(scope="for"))  # a 'for' grant needs expires_at


def test_a_grant_and_a_decision_survive_a_reopen_and_are_seen_by_another_handle(
    backend: Backend, store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    g, a = _grant(), _approval()
    store.add_grant(g)
    store.add_approval(a)
    peer = other()
    assert peer.approvals() == [a]
    peer.decide_approval(a.id, "deny", None, "op", NOW)
    store.close()
    again = backend.open()
    assert again.grants() == [g] and again.approval(a.id).state == "denied"  # type: ignore[union-attr]


def test_an_id_never_begins_with_a_dash_so_the_cli_never_reads_it_as_an_option() -> None:
    """CI on 4432628 failed: a grant id from ``token_urlsafe`` began with ``-`` (1 in 64 do) and
    ``surrogate approvals revoke -0tE…`` was refused by argparse as an unknown option."""
    ids = [new_id() for _ in range(20_000)]  # without the rule, P(no leading "-") ~ e^-312
    assert not [i for i in ids if i.startswith("-")]
    assert {len(i) for i in ids} == {22}
    assert set("".join(ids)) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert len(set(ids)) == len(ids)


def test_deleting_a_claim_revokes_its_grants_and_withdraws_its_approvals(store: CredentialStore) -> None:
    """A claim made again under a deleted claim's id (another sandbox) inherits nothing of it."""
    store.create_claim("gone", "agents")
    mine, theirs = _grant(claim_id="gone"), _grant(claim_id="c1")
    store.add_grant(mine)
    store.add_grant(theirs)
    asked, other_asked = _approval(claim_id="gone"), _approval(claim_id="c1")
    store.add_approval(asked)
    store.add_approval(other_asked)
    assert store.delete_claim("gone")
    assert [g.id for g in store.grants(NOW)] == [theirs.id]
    [revoked] = [g for g in store.grants(None) if g.id == mine.id]
    assert revoked.revoked_at is not None and revoked.revoked_by == "claim deleted"
    assert store.matching_grant("gone", "api.example.com", "POST", "/v1/items", ["gh"], NOW) is None
    assert store.approval(asked.id).state == "withdrawn"  # type: ignore[union-attr]
    assert store.approval(other_asked.id).state == "pending"  # type: ignore[union-attr]


def test_a_claim_has_at_most_max_pending_approvals_pending(store: CredentialStore) -> None:
    """Past the bound the ask is refused (PendingLimit, a Conflict); decided, timed-out and other
    claims' approvals do not count."""
    from proxy.store.approvals import PendingLimit  # noqa: PLC0415

    first, second = _approval(), _approval()
    store.add_approval(_approval(created_at=NOW - 120, expires_at=NOW - 60))  # past its timeout
    store.add_approval(first, max_pending=2)
    store.add_approval(second, max_pending=2)
    store.add_approval(_approval(claim_id="other"), max_pending=2)
    with pytest.raises(PendingLimit):
        store.add_approval(_approval(), max_pending=2)
    assert isinstance(PendingLimit("x"), Conflict)
    store.add_approval(_approval())  # no bound given: none applies
    store.decide_approval(first.id, "deny", None, "operator", NOW)
    store.withdraw_approval(second.id, "client gone")
    store.add_approval(_approval(), max_pending=2)
    with pytest.raises(PendingLimit):
        store.add_approval(_approval(), max_pending=2)


def test_a_withdrawn_or_timed_out_approval_keeps_no_preview(store: CredentialStore) -> None:
    """A sandbox asking and going away at its rate limit stored up to 64 KiB a row, for ever
    (about 23 GB an hour at 100 requests/s): a closed request's preview is dropped, a decided
    one's (an operator's act) kept."""
    gone, late, decided = _approval(preview="x" * 65536), _approval(preview="y" * 100), _approval()
    for a in (gone, late, decided):
        store.add_approval(a)
    assert store.withdraw_approval(gone.id, "client gone") is not None
    assert store.withdraw_approval(late.id, "timeout", "timed_out") is not None
    store.decide_approval(decided.id, "deny", None, "operator", NOW)
    assert store.approval(gone.id).preview == "" and store.approval(late.id).preview == ""  # type: ignore[union-attr]
    assert store.approval(decided.id).preview == decided.preview  # type: ignore[union-attr]
