"""The store's queries, shared by its backends: one class that implements
:class:`proxy.store.base.CredentialStore` over any DB-API connection that takes ``?`` parameters
(SQLite's own; :mod:`proxy.store.postgres` adapts psycopg's).

A backend gives the transactions (:meth:`SQLStore._write` and the others below): what each one
promises is written on it. Everything else is here, once: the checks before a write, sealing
(AES-256-GCM under :mod:`proxy.store.keyring`, associated data from :func:`proxy.store.rows.aad`),
the version bumps, compare-and-set (``if_match``), the kept previous values, budgets counted in
one conditional ``UPDATE`` (atomic in the database, so no two processes can both take the last
use), and key rotation in batches.

The statements are plain SQL that SQLite and PostgreSQL both read (``INSERT ... ON CONFLICT``,
``LIMIT``); they are whole strings, never built from values.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Self

from proxy.core import placeholders
from proxy.core.policy import INTERFACE_NAME
from proxy.store import rows
from proxy.store.approvals import ApprovalQueries
from proxy.store.base import (
    HISTORY_SECONDS,
    HISTORY_VERSIONS,
    PATCHABLE,
    ClaimRecord,
    Conflict,
    Conn,
    CredentialRecord,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from proxy.store.keyring import DecryptError, KeyRing
from proxy.store.kinds import KindQueries
from proxy.store.leases import Leases
from proxy.store.rotation import KeyRotation

_HISTORY_OF = """SELECT key_id, value, version, superseded_at FROM credential_history
    WHERE claim_id = ? AND name = ? ORDER BY version DESC"""
_CLAIMS = "SELECT id, pool, sources, version, created_at, updated_at, interface FROM claims"
_CLAIM = _CLAIMS + " WHERE id = ?"
_CREDS = """SELECT claim_id, name, hosts, inject_header, inject_format, placeholder, version, created_at,
    updated_at, expires_at, last_used_at, surfaces, on_misplaced, max_requests, requests_used,
    headers, basic_parts, (SELECT kind FROM credential_kinds k WHERE k.claim_id = credentials.claim_id
    AND k.name = credentials.name), (SELECT spec FROM credential_kinds k
    WHERE k.claim_id = credentials.claim_id AND k.name = credentials.name) FROM credentials"""
_CRED = _CREDS + " WHERE claim_id = ? AND name = ?"
_CREDS_OF = _CREDS + " WHERE claim_id = ? ORDER BY name"
_SEALED = "SELECT key_id, value, version FROM credentials WHERE claim_id = ? AND name = ?"
_UPSERT = """INSERT INTO credentials (claim_id, name, hosts, inject_header, inject_format, placeholder,
    version, created_at, updated_at, expires_at, last_used_at, key_id, value, surfaces, on_misplaced,
    max_requests, requests_used, headers, basic_parts)
    VALUES (:claim_id, :name, :hosts, :inject_header, :inject_format, :placeholder, :version,
    :created_at, :updated_at, :expires_at, :last_used_at, :key_id, :value, :surfaces, :on_misplaced,
    :max_requests, :requests_used, :headers, :basic_parts)
    ON CONFLICT (claim_id, name) DO UPDATE SET hosts = :hosts, inject_header = :inject_header,
    inject_format = :inject_format, placeholder = :placeholder, version = :version,
    updated_at = :updated_at, expires_at = :expires_at, key_id = :key_id, value = :value,
    surfaces = :surfaces, on_misplaced = :on_misplaced, max_requests = :max_requests,
    requests_used = :requests_used, headers = :headers, basic_parts = :basic_parts"""


class _Spent(Exception):
    """Rolls a budget transaction back: ``name``'s budget was spent."""

    def __init__(self, name: str) -> None:
        self.name = name


class SQLStore(ApprovalQueries, KindQueries, KeyRotation, Leases, ABC):
    """The credential store's operations over a backend's transactions."""

    _keyring: KeyRing
    _errors: ClassVar[tuple[type[Exception], ...]]  # the driver's errors, reported as StoreError

    @abstractmethod
    def _write(self) -> AbstractContextManager[Conn]:
        """One write transaction that changes what the store says: writers are serialised (a
        read-check-write such as ``if_match`` cannot interleave with another writer, in any
        process), the key file is re-read inside it (a key another process retired is never
        written under), it moves :meth:`data_version` for every reader, and it is durable once
        the block returns. Raises StoreError when the store cannot be written now."""

    @abstractmethod
    def _count(self) -> AbstractContextManager[Conn]:
        """A transaction for bookkeeping counts (budgets): atomic and durable, but it need not
        move :meth:`data_version` nor wait for writers of other rows."""

    @abstractmethod
    def _auto(self) -> AbstractContextManager[Conn]:
        """A connection in autocommit: each statement its own durable transaction."""

    @abstractmethod
    def _snapshot(self) -> AbstractContextManager[Conn]:
        """A read transaction: every statement in it sees one consistent state."""

    @abstractmethod
    def data_version(self) -> int: ...

    def _changed(self, claim_id: str, name: str | None = None, *, deleted: bool = False) -> None:
        """Inside a write transaction: it changes the claim (``deleted``: deletes it) or the
        credential ``name`` of it. The SQLite store journals it (proxy.store.localchanges); a write
        that declares nothing makes its readers read a whole snapshot."""

    @abstractmethod
    def touch_used(self, claim_id: str, name: str, at: float) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _one(self, sql: str, *args: object) -> Any:
        with self._auto() as db:
            return db.execute(sql, args).fetchone()

    def _all(self, sql: str, *args: object) -> list[Any]:
        with self._auto() as db:
            return db.execute(sql, args).fetchall()

    def create_claim(
        self, claim_id: str, pool: str, sources: Sequence[str] = (), interface: str | None = None
    ) -> tuple[ClaimRecord, str]:
        """Create a claim; returns it and its proxy token (shown once: only a hash is stored).
        ``interface`` binds its transparent connections to one arrival interface; it needs
        ``sources`` (ValueError otherwise, or for a name that is no interface name)."""
        rows.check_ids(claim_id)
        nets = rows.sources(sources)
        if interface is not None:
            if not isinstance(interface, str) or not INTERFACE_NAME.match(interface):
                raise ValueError(f"{interface!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . @ -)")
            if not nets:
                raise ValueError("interface needs sources: it binds the claim's source addresses")
        token, now = secrets.token_urlsafe(32), time.time()
        with self._write() as db:
            if db.execute("SELECT 1 FROM claims WHERE id = ?", (claim_id,)).fetchone():
                raise Conflict(f"claim {claim_id!r} already exists")
            self._changed(claim_id)
            row = (claim_id, pool, json.dumps(nets), rows.token_hash(token), now, now, interface)
            db.execute(
                "INSERT INTO claims (id, pool, sources, token_hash, version, created_at, updated_at,"
                " interface) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                row,
            )
            return rows.claim(db.execute(_CLAIM, (claim_id,)).fetchone()), token

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        row = self._one(_CLAIM, claim_id)
        return rows.claim(row) if row else None

    def list_claims(self) -> list[ClaimRecord]:
        return [rows.claim(r) for r in self._all(_CLAIMS + " ORDER BY id")]

    def check_token(self, claim_id: str, token: str) -> bool:
        """True when ``token`` is the claim's proxy token (constant-time compare)."""
        row = self._one("SELECT token_hash FROM claims WHERE id = ?", claim_id)
        return hmac.compare_digest(rows.token_hash(token), row[0] if row else bytes(32)) and row is not None

    def rotate_token(self, claim_id: str) -> tuple[ClaimRecord, str]:
        """Replace the claim's proxy token; the old one stops working at once."""
        token = secrets.token_urlsafe(32)
        with self._write() as db:
            sql = "UPDATE claims SET token_hash = ?, version = version + 1, updated_at = ? WHERE id = ?"
            if not db.execute(sql, (rows.token_hash(token), time.time(), claim_id)).rowcount:
                raise NotFound(f"claim {claim_id!r} not found")
            self._changed(claim_id)
            return rows.claim(db.execute(_CLAIM, (claim_id,)).fetchone()), token

    def delete_claim(self, claim_id: str) -> bool:
        """Delete a claim and all its credentials, revoke its grants and withdraw its pending
        approvals (in the same transaction: a claim made again under this id, another sandbox,
        inherits none of them); False when it did not exist."""
        with self._write() as db:
            if db.execute("DELETE FROM claims WHERE id = ?", (claim_id,)).rowcount == 0:
                return False
            self._changed(claim_id, deleted=True)
            db.execute(
                "UPDATE grants SET revoked_at = ?, revoked_by = 'claim deleted' "
                "WHERE claim_id = ? AND revoked_at IS NULL",
                (time.time(), claim_id),
            )
            db.execute(
                "UPDATE approvals SET state = 'withdrawn', reason = 'claim deleted', preview = '' "
                "WHERE claim_id = ? AND state = 'pending'",
                (claim_id,),
            )
            return True

    # --- credentials --------------------------------------------------------------------------

    def put_credential(
        self, claim_id: str, name: str, *, value: bytes, hosts: Sequence[str],
        inject_header: str | None = None, inject_format: str | None = None,
        placeholder: str | None = None, expires_at: float | None = None, if_match: int | None = None,
        surfaces: Sequence[str] | None = None, on_misplaced: str | None = None,
        max_requests: int | None = None, headers: Sequence[str] | None = None,
        basic_parts: Sequence[str] | None = None, kind: str = "static", spec: str | None = None,
        refresh_token: bytes | None = None,
    ) -> CredentialRecord:  # fmt: skip
        """Create or replace a credential; ``if_match`` makes it a compare-and-set on the version.
        A replaced credential's request count starts again at 0 (a PATCH keeps it). ``kind``,
        ``spec`` and ``refresh_token``: proxy.store.kinds (written in the same transaction)."""
        rows.check_ids(claim_id, name)
        if not isinstance(value, bytes):
            raise TypeError("value must be bytes")
        fields: dict[str, Any] = {"value": value, "hosts": hosts, "inject_header": inject_header,
                                  "inject_format": inject_format, "expires_at": expires_at,
                                  "surfaces": surfaces, "on_misplaced": on_misplaced,
                                  "max_requests": max_requests, "requests_used": 0,
                                  "headers": headers, "basic_parts": basic_parts,
                                  "kind": kind, "spec": None if kind == "static" else spec}  # fmt: skip
        if placeholder is not None:
            fields["placeholder"] = placeholder
        with self._write() as db:
            if not db.execute("SELECT 1 FROM claims WHERE id = ?", (claim_id,)).fetchone():
                raise NotFound(f"claim {claim_id!r} not found")
            self._changed(claim_id, name)
            old = self._current(db, claim_id, name, if_match, must_exist=False)
            if old is None:  # a stand-in at version 0, so that creating is replacing nothing
                now = time.time()
                old = CredentialRecord(
                    claim_id, name, (), None, None, placeholders.generate(), 0, now, now, None, None
                )
            new = self._save(db, old, fields)
            self._seal_refresh(db, claim_id, name, refresh_token)
            return new

    def patch_credential(
        self, claim_id: str, name: str, *, if_match: int | None = None, **changes: Any
    ) -> CredentialRecord:
        """Change some of value, hosts, inject_header, inject_format, expires_at, placeholder,
        surfaces, on_misplaced, max_requests, headers, basic_parts.

        None clears inject_header, inject_format or expires_at, and sets surfaces,
        on_misplaced, headers and basic_parts back to their defaults; value, hosts and placeholder
        cannot be cleared. An empty patch changes nothing (and keeps the version).
        """
        if unknown := sorted(set(changes) - PATCHABLE):
            raise TypeError(f"patch_credential() cannot change {', '.join(unknown)}")
        if cleared := sorted(
            k for k in ("value", "hosts", "placeholder") if k in changes and changes[k] is None
        ):
            raise ValueError(f"{', '.join(cleared)} cannot be cleared")
        with self._write() as db:
            self._changed(claim_id, name)
            old = self._current(db, claim_id, name, if_match, must_exist=True)
            assert old is not None
            return self._save(db, old, changes) if changes else old

    def get_credential(self, claim_id: str, name: str) -> CredentialRecord | None:
        row = self._one(_CRED, claim_id, name)
        return rows.cred(row) if row else None

    def list_credentials(self, claim_id: str) -> list[CredentialRecord]:
        return [rows.cred(r) for r in self._all(_CREDS_OF, claim_id)]

    def delete_credential(self, claim_id: str, name: str, if_match: int | None = None) -> bool:
        """Delete a credential; False when absent (PreconditionFailed(None) if ``if_match`` was given)."""
        with self._write() as db:
            if self._current(db, claim_id, name, if_match, must_exist=False) is None:
                return False
            self._changed(claim_id, name)
            db.execute("DELETE FROM credentials WHERE claim_id = ? AND name = ?", (claim_id, name))
            return True

    def secret(self, claim_id: str, name: str) -> tuple[bytes, int]:
        """The decrypted value and its version; raises NotFound or DecryptError."""
        row = self._one(_SEALED, claim_id, name)
        if row is None:
            raise NotFound(f"credential {name!r} of claim {claim_id!r} not found")
        return self._decrypt(claim_id, name, *row), row[2]

    def set_oauth(self, claim_id: str, name: str, spec: dict[str, Any] | None) -> None:
        """Declare (a JSON-able dict, see proxy.core.oauth) or clear (None) a credential's token capture."""
        with self._write() as db:
            if not db.execute(
                "SELECT 1 FROM credentials WHERE claim_id = ? AND name = ?", (claim_id, name)
            ).fetchone():
                raise NotFound(f"credential {name!r} of claim {claim_id!r} not found")
            self._changed(claim_id, name)
            db.execute("DELETE FROM credential_oauth WHERE claim_id = ? AND name = ?", (claim_id, name))
            if spec is not None:
                db.execute(
                    "INSERT INTO credential_oauth VALUES (?, ?, ?)", (claim_id, name, json.dumps(spec))
                )

    def oauth_specs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every declared token capture, by (claim id, credential name)."""
        found = self._all("SELECT claim_id, name, spec FROM credential_oauth")
        return {(c, n): json.loads(spec) for c, n, spec in found}

    def previous_secrets(self, claim_id: str, name: str) -> list[tuple[bytes, int, float]]:
        """The kept previous values of a credential: (value, version, superseded_at), newest
        first. Raises DecryptError when one does not decrypt."""
        found = self._all(_HISTORY_OF, claim_id, name)
        return [(self._decrypt(claim_id, name, k, v, ver), ver, at) for k, v, ver, at in found]

    def spend(self, claim_id: str, name: str) -> bool:
        """Count one request that carries this credential's secret. False (nothing counted) when
        its budget is spent or the credential is gone; True when it had room, or has no budget
        (nothing is written then).

        One committed (fsynced) write per request of a metered credential, so the count survives
        ``kill -9``; like :meth:`touch_used` it does not move this process's :meth:`data_version`.
        Raises StoreError when the write fails (the caller refuses the request).
        """
        with self._auto() as db:
            try:
                cur = db.execute(
                    "UPDATE credentials SET requests_used = requests_used + 1 WHERE claim_id = ? "
                    "AND name = ? AND max_requests IS NOT NULL AND requests_used < max_requests",
                    (claim_id, name),
                )
                if cur.rowcount:
                    return True
                row = db.execute(
                    "SELECT max_requests FROM credentials WHERE claim_id = ? AND name = ?", (claim_id, name)
                ).fetchone()
            except self._errors as e:
                raise StoreError(f"cannot count a use of credential {name!r}: {e}") from None
        return row is not None and row[0] is None

    def spend_rules_budgets(self, claim_id: str, budgets: Sequence[tuple[str, int]]) -> str | None:
        """Count one request that carries the secrets of rules-file credentials, given as
        ``(name, max_requests)`` pairs. Returns the name of the first one whose ``max_requests``
        are already counted (or below 1) — then nothing at all is counted — else None.

        One write transaction of atomic statements (an upsert whose update is conditional),
        committed and fsynced, so every process of the node counts into one number and a budget
        of N is never exceeded; the count is kept across reloads and restarts (a restart must not
        hand out a fresh budget), keyed by (claim id, credential name): a reload that raises
        ``max_requests`` allows that many more. Like :meth:`spend` it does not move this process's
        :meth:`data_version`. Raises StoreError when the write fails.
        """
        try:
            with self._count() as db:
                for name, max_requests in budgets:
                    cur = db.execute(
                        "INSERT INTO rules_budgets SELECT ?, ?, 1 WHERE ? >= 1 "
                        "ON CONFLICT (claim_id, name) DO UPDATE SET requests_used = "
                        "rules_budgets.requests_used + 1 WHERE rules_budgets.requests_used < ?",
                        (claim_id, name, max_requests, max_requests),
                    )
                    if not cur.rowcount:
                        raise _Spent(name)
        except _Spent as spent:
            return spent.name
        except self._errors as e:
            raise StoreError(f"cannot count a use of credentials of claim {claim_id!r}: {e}") from None
        return None

    # --- change detection and key rotation ----------------------------------------------------

    def snapshot(self) -> tuple[list[ClaimRecord], list[CredentialRecord]]:
        """Every claim and credential, read in one transaction (a consistent view)."""
        with self._snapshot() as db:
            claims = [rows.claim(r) for r in db.execute(_CLAIMS + " ORDER BY id")]
            creds = [rows.cred(r) for r in db.execute(_CREDS + " ORDER BY claim_id, name")]
        return claims, creds

    # --- helpers ------------------------------------------------------------------------------

    def _current(
        self, db: Conn, claim_id: str, name: str, if_match: int | None, *, must_exist: bool
    ) -> CredentialRecord | None:
        row = db.execute(_CRED, (claim_id, name)).fetchone()
        old = rows.cred(row) if row else None
        if old is None and must_exist:
            raise NotFound(f"credential {name!r} of claim {claim_id!r} not found")
        if if_match is not None and (old is None or old.version != if_match):
            have = "does not exist" if old is None else f"is at version {old.version}"
            raise PreconditionFailed(
                None if old is None else old.version,
                f"credential {name!r} of claim {claim_id!r} {have}, not {if_match}",
            )
        return old

    def _decrypt(self, claim_id: str, name: str, key_id: str, blob: bytes, version: int) -> bytes:
        try:
            return self._keyring.decrypt(key_id, blob, rows.aad(claim_id, name, version))
        except DecryptError as e:
            raise DecryptError(f"credential {name!r} of claim {claim_id!r}: {e}") from None

    def _keep_previous(self, db: Conn, old: CredentialRecord, sealed: tuple[Any, ...]) -> None:
        """Keep ``old``'s superseded value (sealed as it was) and drop what is past keeping."""
        now, key = time.time(), (old.claim_id, old.name)
        db.execute(
            "INSERT INTO credential_history VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (claim_id, name, version) "
            "DO UPDATE SET superseded_at = excluded.superseded_at, key_id = excluded.key_id, "
            "value = excluded.value",
            (*key, old.version, now, sealed[0], sealed[1]),
        )
        db.execute("DELETE FROM credential_history WHERE superseded_at < ?", (now - HISTORY_SECONDS,))
        db.execute(
            "DELETE FROM credential_history WHERE claim_id = ? AND name = ? AND version NOT IN "
            "(SELECT version FROM credential_history WHERE claim_id = ? AND name = ? "
            "ORDER BY version DESC LIMIT ?)",
            (*key, *key, HISTORY_VERSIONS),
        )

    def _save(self, db: Conn, old: CredentialRecord, changes: dict[str, Any]) -> CredentialRecord:
        """Write ``old`` with ``changes`` at the next version, (re-)encrypting the value under that
        version's associated data. ``old`` may be a stand-in at version 0 for a new credential."""
        value = changes.pop("value", None)
        sealed = db.execute(_SEALED, (old.claim_id, old.name)).fetchone() if old.version else None
        if value is None:
            assert sealed is not None  # a stand-in (version 0) always brings its value
            value = self._decrypt(old.claim_id, old.name, *sealed)
        elif sealed is not None and self._decrypt(old.claim_id, old.name, *sealed) != value:
            self._keep_previous(db, old, sealed)
        if not isinstance(value, bytes):
            raise TypeError("value must be bytes")
        new = rows.next_record(old, changes, time.time())
        sql = (
            "SELECT claim_id, name FROM credentials WHERE placeholder = ? AND NOT (claim_id = ? AND name = ?)"
        )
        if owner := db.execute(sql, (new.placeholder, old.claim_id, old.name)).fetchone():
            raise Conflict(
                f"placeholder {new.placeholder} is already used by credential {owner[1]!r} "
                f"of claim {owner[0]!r}"
            )
        self._check_placeholders(db, new.claim_id, new.name, new.placeholder, new.kind, new.spec)
        key_id, blob = self._keyring.encrypt(value, rows.aad(new.claim_id, new.name, new.version))
        row = rows.credential_row(new, key_id, blob)
        db.execute(_UPSERT, row)
        if (new.kind, new.spec) != (old.kind, old.spec) or old.version == 0:
            self._save_kind(db, new.claim_id, new.name, new.kind, new.spec)
        return new
