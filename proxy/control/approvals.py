"""The approvals' control logic (issue 16): list and decide held requests, list and revoke grants,
each write audited. No HTTP here: the API routes (:mod:`proxy.control.approvalroutes`), the CLI
and the operator's web page (``/ui/approvals``) all call these same functions.

A decision is a compare-and-set in the store (:meth:`proxy.store.base.CredentialStore.decide_approval`):
a second decision, or one after the timeout, is 409 ``approval_not_pending``. An approval with a
scope other than ``once`` also writes a grant (:mod:`proxy.core.approvals` says what it covers)
and audits ``grant_created``. The node holding the request is woken in-process through
:func:`notify` when the decision came through its own control listener; otherwise it sees the
decision by polling the store.

Audit events (``proxy.audit``): ``approval_decided`` {approval, request_id, verdict, scope, who},
``grant_created`` {grant, approval, request_id, scope, who}, ``grant_revoked`` {grant, who}.

Errors: :class:`proxy.control.checks.ControlError`: 404 ``not_found``, 409
``approval_not_pending``, 422 ``bad_scope``, 503 ``store_unavailable``; never a value.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from proxy import audit
from proxy.control.checks import ControlError
from proxy.core.approvals import grantable
from proxy.core.errors import SurrogateError
from proxy.store.base import ApprovalRecord, Conflict, CredentialStore, GrantRecord, NotFound, new_id

_waiters: dict[str, list[Callable[[ApprovalRecord], None]]] = {}
_watchers: list[Callable[[ApprovalRecord], None]] = []
_lock = threading.Lock()


def wait_for(approval_id: str, wake: Callable[[ApprovalRecord], None]) -> Callable[[], None]:
    """Call ``wake(record)`` (from any thread) when this process decides ``approval_id``; returns
    the function that stops waiting."""
    with _lock:
        _waiters.setdefault(approval_id, []).append(wake)

    def stop() -> None:
        with _lock:
            left = [w for w in _waiters.get(approval_id, []) if w is not wake]
            if left:
                _waiters[approval_id] = left
            else:
                _waiters.pop(approval_id, None)

    return stop


def watch(listener: Callable[[ApprovalRecord], None]) -> Callable[[], None]:
    """Call ``listener(record)`` for every approval this process asks or decides (the SSE stream)."""
    with _lock:
        _watchers.append(listener)
    return lambda: _unwatch(listener)


def _unwatch(listener: Callable[[ApprovalRecord], None]) -> None:
    with _lock, contextlib.suppress(ValueError):
        _watchers.remove(listener)


def notify(record: ApprovalRecord) -> None:
    """Tell this process's waiters (for a decided one) and watchers about ``record``."""
    with _lock:
        wakes = list(_waiters.get(record.id, [])) if record.state != "pending" else []
        listeners = list(_watchers)
    for fn in wakes + listeners:
        try:
            fn(record)
        except Exception:  # noqa: BLE001, S112 - one listener's failure is not the decision's
            continue


def public(record: ApprovalRecord | GrantRecord) -> dict[str, Any]:
    """The JSON shape of a record (lists for tuples); it holds no secret (the preview is redacted)."""
    out = asdict(record)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def _store_failed(e: SurrogateError) -> ControlError:
    if isinstance(e, NotFound):
        return ControlError(404, "not_found", str(e))
    if isinstance(e, Conflict):
        return ControlError(409, "approval_not_pending", str(e))
    return ControlError(503, "store_unavailable", f"the credential store failed: {type(e).__name__}")


def list_approvals(store: CredentialStore, state: str | None = "pending") -> list[ApprovalRecord]:
    """Approvals in ``state`` ("all" or None: every one). 422 ``bad_state``; 503."""
    try:
        return store.approvals(None if state in (None, "all") else state)
    except ValueError as e:
        raise ControlError(422, "bad_state", str(e)) from None
    except SurrogateError as e:
        raise _store_failed(e) from None


def decide(
    store: CredentialStore, approval_id: str, verdict: str, scope: str | None, who: str,
    now: float | None = None,
) -> tuple[ApprovalRecord, GrantRecord | None]:  # fmt: skip
    """Approve (``scope``: once, session, for:DURATION, always; default once) or deny a pending
    approval; an approval with a standing scope also writes its grant. 404, 409, 422, 503."""
    now = time.time() if now is None else now
    if verdict == "approve" and scope not in (None, "once"):
        try:
            asked = store.approval(approval_id)
        except SurrogateError as e:
            raise _store_failed(e) from None
        _check_grantable(asked)
    try:
        record = store.decide_approval(approval_id, verdict, scope, who, now)
    except ValueError as e:
        raise ControlError(422, "bad_scope", str(e)) from None
    except SurrogateError as e:
        raise _store_failed(e) from None
    log = audit.logger()
    log.info("approval_decided", approval=record.id, request_id=record.request_id, claim=record.claim_id,
             verdict=verdict, scope=record.scope, who=who)  # fmt: skip
    grant = None
    if record.state == "approved" and record.scope and record.scope != "once":
        grant = _grant_for(record, who, now)
        try:
            store.add_grant(grant)
        except SurrogateError as e:
            raise _store_failed(e) from None
        log.info("grant_created", grant=grant.id, approval=record.id, request_id=record.request_id,
                 claim=record.claim_id, host=record.host, scope=record.scope, who=who)  # fmt: skip
    notify(record)
    return record, grant


def _check_grantable(record: ApprovalRecord | None) -> None:
    """422 for a standing scope on a path with more than one reading (proxy.core.approvals), also
    for an approval a node without that check stored with every scope offered."""
    if record is not None and not grantable(record.path):
        raise ControlError(
            422, "bad_scope", f"approval {record.id}: its path has more than one reading; approve it once"
        )


def _grant_for(record: ApprovalRecord, who: str, now: float) -> GrantRecord:
    from proxy.core.paths import canonical_path  # noqa: PLC0415 - only a standing approval needs it

    kind, _, seconds = (record.scope or "").partition(":")
    return GrantRecord(
        id=new_id(), claim_id=record.claim_id, credentials=record.credentials,
        method=record.method, host=record.host, port=record.port,
        path_prefix=canonical_path(record.path).canonical, scope=kind, created_at=now,
        expires_at=now + int(seconds) if kind == "for" else None, approved_by=who,
        session=record.session if kind == "session" else None, approval_id=record.id,
    )  # fmt: skip


def list_grants(store: CredentialStore, active: bool = True, now: float | None = None) -> list[GrantRecord]:
    """Grants (``active``: only those neither revoked nor expired now). 503."""
    try:
        return store.grants((time.time() if now is None else now) if active else None)
    except SurrogateError as e:
        raise _store_failed(e) from None


def revoke_grant(store: CredentialStore, grant_id: str, who: str) -> None:
    """Revoke a grant; the next matching request asks again. 404, 503."""
    try:
        store.revoke_grant(grant_id, who)
    except SurrogateError as e:
        raise _store_failed(e) from None
    audit.logger().info("grant_revoked", grant=grant_id, who=who)
