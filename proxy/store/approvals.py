"""The approvals' queries, shared by the store's backends (a mixin of
:class:`proxy.store.queries.SQLStore`; issue 16, the contract in base.py's records).

Tables (SQLite: created when absent on every open, :mod:`proxy.store.schema`; PostgreSQL:
schema version 3, :mod:`proxy.store.pgschema`)::

    approvals(id PK, claim_id, pool, method, host, port, path, credentials JSON, preview, rule,
              scopes JSON, created_at, expires_at, state, decided_at, decided_by, scope, reason,
              session, request_id)
    grants(id PK, claim_id, credentials JSON, method, host, port, path_prefix, scope, created_at,
           expires_at, approved_by, session, revoked_at, revoked_by, approval_id)

Every state change is one conditional ``UPDATE ... WHERE state = 'pending'`` in a bookkeeping
transaction (``_count``): atomic in the database, so of concurrent deciders on any node exactly
one changes the row, and the others read the state it left (Conflict). Approvals do not move
``data_version``: no credential or claim changed, and a node waiting for a decision polls
:meth:`ApprovalQueries.approval` (or is woken in-process by its own control listener).

No secret is ever stored here: the preview is redacted by the node before ``add_approval``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import astuple
from typing import Any

from proxy.core import approvals as core
from proxy.core.paths import canonical_path
from proxy.store.base import APPROVAL_STATES, ApprovalRecord, Conflict, Conn, GrantRecord, NotFound

_A_COLS = """id, claim_id, pool, method, host, port, path, credentials, preview, rule, scopes,
    created_at, expires_at, state, decided_at, decided_by, scope, reason, session, request_id"""
_APPROVALS = f"SELECT {_A_COLS} FROM approvals"  # noqa: S608 - a constant column list
_APPROVAL = _APPROVALS + " WHERE id = ?"
_G_COLS = """id, claim_id, credentials, method, host, port, path_prefix, scope, created_at, expires_at,
    approved_by, session, revoked_at, revoked_by, approval_id"""
_GRANTS = f"SELECT {_G_COLS} FROM grants"  # noqa: S608 - a constant column list
_MAX_PREVIEW = 64 * 1024


def _approval(row: Sequence[Any]) -> ApprovalRecord:
    r = list(row)
    r[5], r[7], r[10] = int(r[5]), tuple(json.loads(r[7])), tuple(json.loads(r[10]))
    return ApprovalRecord(*r)


def _grant(row: Sequence[Any]) -> GrantRecord:
    r = list(row)
    r[2], r[5] = tuple(json.loads(r[2])), int(r[5])
    return GrantRecord(*r)


class PendingLimit(Conflict):
    """A claim already has as many pending approvals as it may (``limits.approvals``)."""


def _check_id(value: object) -> str:
    if (
        not isinstance(value, str)
        or not 16 <= len(value) <= 64
        or not value.replace("-", "").replace("_", "").isalnum()
    ):
        raise ValueError("an approval or grant id is 16 to 64 url-safe characters")
    return value


class ApprovalQueries(ABC):
    """Approvals and grants over a backend's transactions (see :class:`proxy.store.queries.SQLStore`)."""

    @abstractmethod
    def _count(self) -> AbstractContextManager[Conn]: ...

    @abstractmethod
    def _auto(self) -> AbstractContextManager[Conn]: ...

    def add_approval(self, record: ApprovalRecord, *, max_pending: int | None = None) -> None:
        """Store a new pending approval. Conflict for a taken id; :class:`PendingLimit` when its
        claim already has ``max_pending`` pending approvals not past their timeout (counted in
        the write's transaction: exact on SQLite, whose writers are serialised; on PostgreSQL
        concurrent asks of one claim may each see one fewer); ValueError for a bad field."""
        _check_id(record.id)
        if record.state != "pending" or len(record.preview) > _MAX_PREVIEW:
            raise ValueError("a new approval is pending, with a preview of at most 64 KiB")
        core.check_scopes(list(record.scopes))
        row = list(astuple(record))
        row[7], row[10] = json.dumps(list(record.credentials)), json.dumps(list(record.scopes))
        with self._count() as db:
            if db.execute("SELECT 1 FROM approvals WHERE id = ?", (record.id,)).fetchone():
                raise Conflict(f"approval {record.id} already exists")
            if max_pending is not None:
                (held,) = db.execute(
                    "SELECT COUNT(*) FROM approvals WHERE claim_id = ? AND state = 'pending'"
                    " AND expires_at > ?",
                    (record.claim_id, record.created_at),
                ).fetchone()
                if held >= max_pending:
                    raise PendingLimit(f"claim {record.claim_id!r} already has {held} requests held")
            db.execute(f"INSERT INTO approvals ({_A_COLS}) VALUES ({', '.join('?' * len(row))})", row)  # noqa: S608

    def approvals(self, state: str | None = "pending") -> list[ApprovalRecord]:
        """Approvals in ``state`` (None: every one), oldest first. ValueError for an unknown state."""
        with self._auto() as db:
            if state is None:
                rows = db.execute(_APPROVALS + " ORDER BY created_at, id").fetchall()
            elif state in APPROVAL_STATES:
                rows = db.execute(
                    _APPROVALS + " WHERE state = ? ORDER BY created_at, id", (state,)
                ).fetchall()
            else:
                raise ValueError(
                    f"unknown approval state {state!r}; expected one of: {', '.join(APPROVAL_STATES)}"
                )
        return [_approval(r) for r in rows]

    def approval(self, approval_id: str) -> ApprovalRecord | None:
        with self._auto() as db:
            row = db.execute(_APPROVAL, (approval_id,)).fetchone()
        return None if row is None else _approval(row)

    def decide_approval(
        self, approval_id: str, verdict: str, scope: str | None, by: str, now: float
    ) -> ApprovalRecord:
        """Approve (with ``scope``, canonicalised; default ``once``) or deny a pending approval.
        Compare-and-set: Conflict (naming the state now) when it is no longer pending or is past
        its timeout; NotFound; ValueError for a bad verdict or a scope not offered."""
        if verdict not in ("approve", "deny"):
            raise ValueError("verdict must be approve or deny")
        current = self.approval(approval_id)
        if current is None:
            raise NotFound(f"no approval {approval_id!r}")
        chosen = core.canonical_scope(scope or "once", current.scopes) if verdict == "approve" else None
        state = "approved" if verdict == "approve" else "denied"
        with self._count() as db:
            changed = db.execute(
                "UPDATE approvals SET state = ?, decided_at = ?, decided_by = ?, scope = ? "
                "WHERE id = ? AND state = 'pending' AND expires_at > ?",
                (state, now, by, chosen, approval_id, now),
            ).rowcount
            row = db.execute(_APPROVAL, (approval_id,)).fetchone()
        record = _approval(row)
        if changed != 1:
            now_state = record.state if record.state != "pending" else "timed out"
            raise Conflict(f"approval {approval_id} is no longer pending (it is {now_state})")
        return record

    def withdraw_approval(
        self, approval_id: str, reason: str, state: str = "withdrawn"
    ) -> ApprovalRecord | None:
        """Close a pending approval as ``withdrawn`` or ``timed_out``; None when it was not pending.
        Its preview is dropped: nobody will decide it, and a sandbox asking and going away at its
        rate limit would otherwise keep up to 64 KiB a row for ever (review r-approve)."""
        if state not in ("withdrawn", "timed_out"):
            raise ValueError("withdraw_approval closes as withdrawn or timed_out")
        with self._count() as db:
            changed = db.execute(
                "UPDATE approvals SET state = ?, reason = ?, preview = '' WHERE id = ? AND state = 'pending'",
                (state, reason[:200], approval_id),
            ).rowcount
            row = db.execute(_APPROVAL, (approval_id,)).fetchone()
        return _approval(row) if changed == 1 else None

    def add_grant(self, record: GrantRecord) -> None:
        """Store a grant. Conflict for a taken id; ValueError for a bad scope or prefix."""
        _check_id(record.id)
        if record.scope not in ("session", "for", "always") or not record.path_prefix.startswith("/"):
            raise ValueError("a grant's scope is session, for or always; its path prefix starts with /")
        if (record.scope == "for") != (record.expires_at is not None) or (record.scope == "session") != bool(
            record.session
        ):
            raise ValueError("a 'for' grant (only) has expires_at; a 'session' grant (only) has a session")
        row = list(astuple(record))
        row[2] = json.dumps(sorted(record.credentials))
        with self._count() as db:
            if db.execute("SELECT 1 FROM grants WHERE id = ?", (record.id,)).fetchone():
                raise Conflict(f"grant {record.id} already exists")
            db.execute(f"INSERT INTO grants ({_G_COLS}) VALUES ({', '.join('?' * len(row))})", row)  # noqa: S608

    def grants(self, active_at: float | None = None) -> list[GrantRecord]:
        """Grants, oldest first; with ``active_at``, only those neither revoked nor expired then."""
        with self._auto() as db:
            if active_at is None:
                rows = db.execute(_GRANTS + " ORDER BY created_at, id").fetchall()
            else:
                rows = db.execute(
                    _GRANTS + " WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)"
                    " ORDER BY created_at, id",
                    (active_at,),
                ).fetchall()
        return [_grant(r) for r in rows]

    def revoke_grant(self, grant_id: str, by: str, now: float | None = None) -> None:
        """Revoke a grant (NotFound when absent); a second revoke keeps the first time."""
        import time  # noqa: PLC0415 - the store stamps its own writes (as created_at elsewhere)

        with self._count() as db:
            if not db.execute("SELECT 1 FROM grants WHERE id = ?", (grant_id,)).fetchone():
                raise NotFound(f"no grant {grant_id!r}")
            db.execute(
                "UPDATE grants SET revoked_at = ?, revoked_by = ? WHERE id = ? AND revoked_at IS NULL",
                (time.time() if now is None else now, by, grant_id),
            )

    def matching_grant(
        self, claim: str, host: str, method: str, path: str, credential_names: Sequence[str],
        now: float, *, port: int | None = None, session: str | None = None,
    ) -> GrantRecord | None:  # fmt: skip
        """The oldest active grant that covers this request (see :mod:`proxy.core.approvals`)."""
        with self._auto() as db:
            rows = db.execute(
                _GRANTS + " WHERE claim_id = ? AND host = ? AND method = ? AND revoked_at IS NULL"
                " AND (expires_at IS NULL OR expires_at > ?) ORDER BY created_at, id",
                (claim, host, method, now),
            ).fetchall()
        wanted, where = set(credential_names), canonical_path(path)
        for grant in map(_grant, rows):
            if port is not None and grant.port != port:
                continue
            if grant.scope == "session" and (session is None or grant.session != session):
                continue
            if wanted <= set(grant.credentials) and where.within(grant.path_prefix):
                return grant
        return None
