"""The run-time credential store: claims, their proxy tokens and credentials, in one SQLite file.

The file is ``<state dir>/store.sqlite3``, mode 0600 (SQLite gives its WAL and shm the same mode);
the keys live apart, in :mod:`proxy.store.keyring`'s key file.

Schema (``PRAGMA user_version = 5``, :mod:`proxy.store.schema`; created when absent, older files
migrated in place)::

    claims(id TEXT PK, pool, sources JSON, token_hash BLOB  -- sha256 of the token, never the token
           version, created_at, updated_at)
    credentials(claim_id -> claims.id ON DELETE CASCADE, name, PK (claim_id, name),
                hosts JSON, inject_header, inject_format, placeholder UNIQUE,
                key_id, value BLOB  -- nonce + AES-256-GCM ciphertext, see proxy.store.keyring
                version, created_at, updated_at, expires_at, last_used_at,
                surfaces JSON  -- null: the default (header, basic); since version 2
                on_misplaced   -- null: carry; since version 2
                max_requests   -- the request budget, NULL: none; since version 3
                requests_used  -- requests that carried the secret; reset by a PUT, kept by a PATCH
                headers JSON   -- header slots (proxy.core.slots), null: the default list; since version 4
                basic_parts JSON) -- Basic slots, null: the password only; since version 4
    credential_history(claim_id, name -> credentials ON DELETE CASCADE, version, PK of the three,
                superseded_at, key_id, value BLOB  -- a replaced value, sealed as it was stored)
    credential_oauth(claim_id, name -> credentials ON DELETE CASCADE, PK of the two,
                spec JSON  -- OAuth token capture, see proxy.core.oauth)
    rules_budgets(claim_id, name, PK of the two,  -- a rules-file credential (no foreign key)
                requests_used)  -- its max_requests count, shared by every worker (spend_rules_budgets)
    credential_kinds(claim_id, name -> credentials ON DELETE CASCADE, PK of the two,
                kind, spec JSON)  -- a kind's non-secret block (proxy.store.kinds); none: static
    credential_tokens(claim_id, name -> credentials ON DELETE CASCADE, PK of the two,
                generation, updated_at, key_id, value BLOB)  -- an oauth_client's refresh token, sealed
    credential_spec_placeholders(claim_id, name -> credentials ON DELETE CASCADE, placeholder,
                PK (claim_id, placeholder))  -- an aws_sigv4 spec's placeholders (proxy.store.kinds)

A migration only adds columns (``ALTER TABLE ... ADD COLUMN``, nullable or with a default) in one
write transaction, so an older store keeps every row and reads as the defaults it was written with.

A replaced value is kept in ``credential_history`` for response scrubbing (see
:mod:`proxy.store.live`: at most 8 per credential, for 24 hours); that table is created on open when
absent, whatever the schema version (it needs no migration); so are ``credential_oauth`` and
``rules_budgets``.

A value is encrypted with associated data ``claim_id NUL name NUL version``, so a ciphertext
copied to another row or version fails to decrypt; a metadata change bumps the version and so
re-encrypts the value in the same transaction. No plaintext value is ever written to the file or
its WAL. ``secure_delete`` zeroes deleted rows in the main file (old WAL frames are overwritten as
the WAL is reused), so a deleted credential's ciphertext does not linger beside a live key.

Durability: WAL mode with ``synchronous=FULL`` fsyncs the WAL at every commit, so a write that
returned survives ``kill -9`` and power loss (NORMAL would lose the last commits on power loss).
WAL also lets the proxy read while a sidecar (``surrogate control``) writes. Every write is one
short ``BEGIN IMMEDIATE`` transaction (it takes the write lock up front, so a read-check-write
such as ``if_match`` cannot interleave with another process; ``busy_timeout`` is 5 s), and a
reader notices other processes' commits through :meth:`Store.data_version`.

Errors: :mod:`proxy.store.base` (StoreError and its kinds; KeyFileError and DecryptError from
the keyring). The schema and its migrations are :mod:`proxy.store.schema`; the row helpers (checks,
associated data, token hashes) :mod:`proxy.store.rows`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

from proxy.store import localchanges, schema
from proxy.store.base import (
    HISTORY_SECONDS,
    HISTORY_VERSIONS,
    Changes,
    ClaimRecord,
    Conflict,
    CredentialRecord,
    CredentialStore,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from proxy.store.keyring import KeyRing
from proxy.store.leases import take_statement
from proxy.store.queries import SQLStore

__all__ = [  # the names other modules have imported from here since before the split
    "FILENAME", "HISTORY_SECONDS", "HISTORY_VERSIONS", "SCHEMA_VERSION", "ClaimRecord", "Conflict",
    "CredentialRecord", "CredentialStore", "NotFound", "PreconditionFailed", "Store", "StoreError",
    "open_state_store",
]  # fmt: skip

FILENAME = "store.sqlite3"
SCHEMA_VERSION = schema.SCHEMA_VERSION
_TOUCH_EVERY = 1.0  # seconds: last_used_at is a hint, not worth an fsync per request
_BUSY_MS = 5000

STORE_FILE = "store.sqlite3"
KEY_FILE = "store.key"


def open_state_store(state_dir: Path, create: bool = True, key_file: Path | None = None) -> Store:
    """The state dir's store (``store.sqlite3``) under its key file (``key_file``, by default
    ``store.key`` in the state dir; 0600).

    ``create=False`` refuses (ValueError) a state dir that has no store yet, instead of making one.
    """
    db, key = state_dir / STORE_FILE, key_file or state_dir / KEY_FILE
    if not create:
        for path in (db, key):
            if not path.is_file():
                raise ValueError(f"{state_dir}: no credential store there ({path.name} is missing)")
    return Store.open(db, KeyRing.load_or_create(key))


class Store(SQLStore):
    """The SQLite credential store: one connection, safe to share between threads."""

    _errors: ClassVar[tuple[type[Exception], ...]] = (sqlite3.Error,)
    _LEASE_TAKE: ClassVar[str] = take_statement("((julianday('now') - 2440587.5) * 86400.0)")

    def __init__(self, db: sqlite3.Connection, keyring: KeyRing, path: Path) -> None:
        self.path = path
        self._db = db
        self._keyring = keyring
        self._lock = threading.RLock()
        # PRAGMA data_version ignores this connection's own commits: they are counted here, with
        # what each touched, so this process's registry applies them one by one (changes_since)
        self._local = localchanges.LocalChanges()
        self._touched: dict[tuple[str, str], float] = {}

    @classmethod
    def open(cls, path: Path, keyring: KeyRing) -> Store:
        """Open (creating when absent) the store file ``path``, or ``path/store.sqlite3`` for a folder."""
        path = Path(path)
        path = path / FILENAME if path.is_dir() else path
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # the WAL and shm copy this mode
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open store {path}: {getattr(e, 'strerror', None) or e}") from None
        try:
            for pragma in (f"busy_timeout = {_BUSY_MS}", "synchronous = FULL", "foreign_keys = ON",
                           "secure_delete = ON"):  # fmt: skip
                db.execute(f"PRAGMA {pragma}")
            if db.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
                raise StoreError(f"store {path} cannot use WAL mode on this file system")
            store = cls(db, keyring, path)
            if schema.migration_needed(db):
                with store._write():
                    schema.migrate(db, path)
        except sqlite3.DatabaseError as e:
            db.close()
            raise StoreError(f"store {path} is not a usable SQLite database: {e}") from None
        except BaseException:
            db.close()
            raise
        return store

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"Store(path={str(self.path)!r})"

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction. The key file is re-read inside it, so that a key another
        process retired (it does so inside a write transaction too) is never written under."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:  # busy past busy_timeout, read-only, disk full
                raise StoreError(f"store {self.path} cannot be written now: {e}") from None
            try:
                # a commit of another connection is seen here at the latest (the write lock is
                # held: none can fall between this look and the COMMIT)
                self._local.saw(int(self._db.execute("PRAGMA data_version").fetchone()[0]))
                self._local.begin()
                self._keyring.refresh()
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._local.committed()

    def _changed(self, claim_id: str, name: str | None = None, *, deleted: bool = False) -> None:
        self._local.touch(claim_id, name, deleted=deleted)

    @contextmanager
    def _count(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` without the key file's re-read (no value is sealed here)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def _auto(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._db

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    # --- bookkeeping and change detection ------------------------------------------------------

    def touch_used(self, claim_id: str, name: str, at: float) -> None:
        """Record a use. Best effort: at most one write a second per credential, skipped when busy.

        This process's :meth:`data_version` does not count it as a change (a proxy need not
        rebuild its index for its own bookkeeping); other processes do see the commit.
        """
        if at - self._touched.get((claim_id, name), float("-inf")) < _TOUCH_EVERY:
            return
        with self._lock:
            self._db.execute("PRAGMA busy_timeout = 0")  # never stall a request behind a writer
            try:
                self._db.execute(
                    "UPDATE credentials SET last_used_at = ? WHERE claim_id = ? AND name = ? "
                    "AND (last_used_at IS NULL OR last_used_at <= ?)",
                    (at, claim_id, name, at - _TOUCH_EVERY),
                )
                self._touched[claim_id, name] = at
            except sqlite3.OperationalError:
                pass  # another process is writing: a later use records it
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")

    def data_version(self) -> int:
        """A number that changes after any commit to the file, by this or another connection
        (:mod:`proxy.store.localchanges`: counted by this handle, so only it compares them)."""
        with self._lock:
            return self._local.saw(int(self._db.execute("PRAGMA data_version").fetchone()[0]))

    def changes_since(self, version: int) -> Changes | None:
        """The rows this process's own writes after ``version`` touched, read now; None when
        another connection committed since, or a write declared nothing, or ``version`` is older
        than the journal: the caller then reads a whole :meth:`snapshot`."""
        with self._lock:
            now = self.data_version()
            touched = self._local.since(version)
            if touched is None:
                return None
            with self._snapshot() as db:
                return localchanges.read(db, now, touched)
