"""The approvals' service functions (proxy.control.approvals): decide once, grants written for
standing scopes only and covering only the approved request, revoke, audit events, in-process wake."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.control import approvals as service
from proxy.control.checks import ControlError
from proxy.store.base import ApprovalRecord
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store

NOW = time.time()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "s.sqlite3", KeyRing.load_or_create(tmp_path / "k"))
    yield s
    s.close()


def _ask(store: Store, **kw: object) -> ApprovalRecord:
    a = ApprovalRecord(
        id=secrets.token_urlsafe(16), claim_id="c1", pool="p", method="POST", host="api.example.com",
        port=443, path="/v1/items/3?x=1", credentials=("gh",), preview="", rule="r",
        scopes=("once", "for", "session"),
        created_at=NOW, expires_at=NOW + 60, session="run:1", request_id="req-1",
    )  # fmt: skip
    a = replace(a, **kw)  # type: ignore[arg-type]
    store.add_approval(a)
    return a


def test_approve_for_ten_minutes_writes_a_grant_for_that_request_only_and_audits(store: Store) -> None:
    a = _ask(store)
    woken: list[str] = []
    stop = service.wait_for(a.id, lambda r: woken.append(r.state))
    with capture_logs() as logs:
        record, grant = service.decide(store, a.id, "approve", "for:10m", "token:ops", NOW)
    stop()
    assert woken == ["approved"] and record.scope == "for:600"
    assert grant is not None and (grant.path_prefix, grant.expires_at, grant.credentials) == (
        "/v1/items/3",
        NOW + 600,
        ("gh",),
    )
    assert [e["event"] for e in logs] == ["approval_decided", "grant_created"]
    assert logs[0]["request_id"] == "req-1" and logs[1]["grant"] == grant.id
    assert (
        service.list_grants(store, now=NOW + 1) == [grant] and service.list_grants(store, now=NOW + 601) == []
    )
    with pytest.raises(ControlError) as again:
        service.decide(store, a.id, "deny", None, "token:ops", NOW)
    assert (again.value.status, again.value.code) == (409, "approval_not_pending")
    with capture_logs() as logs:
        service.revoke_grant(store, grant.id, "token:ops")
    assert [e["event"] for e in logs] == ["grant_revoked"] and service.list_grants(store, now=NOW + 1) == []


@pytest.mark.parametrize(("verdict", "scope"), [("approve", "once"), ("deny", None)], ids=["once", "deny"])
def test_once_and_deny_write_no_grant(store: Store, verdict: str, scope: str | None) -> None:
    a = _ask(store)
    _, grant = service.decide(store, a.id, verdict, scope, "op", NOW)
    assert grant is None and store.grants() == []


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [(lambda s, a: service.decide(s, a.id, "approve", "always", "op"), 422, "bad_scope"),
     (lambda s, a: service.decide(s, "n" * 22, "deny", None, "op"), 404, "not_found"),
     (lambda s, a: service.revoke_grant(s, "n" * 22, "op"), 404, "not_found"),
     (lambda s, a: service.list_approvals(s, "nope"), 422, "bad_state")],
    ids=["scope-not-offered", "unknown-approval", "unknown-grant", "bad-state"],
)  # fmt: skip
def test_bad_calls_are_typed_errors(store: Store, call: object, status: int, reason: str) -> None:
    a = _ask(store)
    with pytest.raises(ControlError) as e:
        call(store, a)  # type: ignore[operator]
    assert (e.value.status, e.value.code) == (status, reason)
    assert store.approval(a.id) == a


def test_list_approvals_by_state(store: Store) -> None:
    a, b = _ask(store), _ask(store, created_at=NOW + 1)
    service.decide(store, b.id, "deny", None, "op", NOW)
    assert service.list_approvals(store) == [a]
    assert [r.id for r in service.list_approvals(store, "all")] == [a.id, b.id]


@pytest.mark.parametrize(
    "path", ["/v1/a/%2e%2e/b", "/v1/a/../b", "/v1/a%2Fb", "/v1//a", "/v1/a;p", "*", "/v1/a#b"]
)
def test_a_standing_scope_for_a_path_with_more_than_one_reading_is_refused(store: Store, path: str) -> None:
    """An approval stored with every scope offered (a node without the check) of a path whose
    canonical reading is '/' or another resource: no grant, 422, and it stays pending."""
    a = _ask(store, path=path, scopes=("once", "session", "for", "always"))
    for scope in ("for:10m", "always", "session"):
        with pytest.raises(ControlError) as e:
            service.decide(store, a.id, "approve", scope, "token:ops", NOW)
        assert (e.value.status, e.value.code) == (422, "bad_scope")
    assert store.approval(a.id).state == "pending" and service.list_grants(store, now=NOW) == []  # type: ignore[union-attr]
    record, grant = service.decide(store, a.id, "approve", "once", "token:ops", NOW)
    assert record.state == "approved" and grant is None
