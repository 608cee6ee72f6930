"""The run-time credential store: claims, their proxy tokens and credentials, in one SQLite file.

The file is ``<state dir>/store.sqlite3``, mode 0600 (SQLite gives its WAL and shm the same mode);
the keys live apart, in :mod:`proxy.store.keyring`'s key file.

Schema (``PRAGMA user_version = 4``; created when absent, older files migrated in place)::

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

Errors::

    SurrogateError (proxy.core.errors)
    ├── StoreError               the file cannot be used (newer schema, not SQLite, busy over 5 s)
    │   ├── NotFound             no such claim / credential
    │   ├── Conflict             id or placeholder already taken; names the owner, never a value
    │   └── PreconditionFailed   ``if_match`` is stale; ``current`` is the version now (None: absent)
    ├── KeyFileError (keyring)   the key file is unsafe or malformed
    └── DecryptError (keyring)   a stored value does not decrypt

Bad arguments (a malformed source, placeholder or id; a value that is not bytes) raise ValueError
or TypeError before anything is written.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import itertools
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from proxy.core import placeholders, slots
from proxy.core.errors import SurrogateError
from proxy.core.policy import INTERFACE_NAME, SURFACES, Misplaced
from proxy.store.keyring import DecryptError, KeyRing

FILENAME = "store.sqlite3"
SCHEMA_VERSION = 5
_SCHEMA = (
    """CREATE TABLE claims (
      id TEXT PRIMARY KEY, pool TEXT NOT NULL, sources TEXT NOT NULL, token_hash BLOB NOT NULL,
      version INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL) STRICT""",
    """CREATE TABLE credentials (
      claim_id TEXT NOT NULL REFERENCES claims(id) ON DELETE CASCADE, name TEXT NOT NULL,
      hosts TEXT NOT NULL, inject_header TEXT, inject_format TEXT, placeholder TEXT NOT NULL UNIQUE,
      version INTEGER NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL, expires_at REAL,
      last_used_at REAL, key_id TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (claim_id, name)) STRICT""",
    "CREATE INDEX credentials_key_id ON credentials(key_id)",
)
# _MIGRATIONS[n] takes a store from schema version n to n + 1 (a new store runs them all).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE credentials ADD COLUMN surfaces TEXT",
        "ALTER TABLE credentials ADD COLUMN on_misplaced TEXT",
    ),
    2: (  # the request budget
        "ALTER TABLE credentials ADD COLUMN max_requests INTEGER",
        "ALTER TABLE credentials ADD COLUMN requests_used INTEGER NOT NULL DEFAULT 0",
    ),
    3: (  # substitution slots (proxy.core.slots)
        "ALTER TABLE credentials ADD COLUMN headers TEXT",
        "ALTER TABLE credentials ADD COLUMN basic_parts TEXT",
    ),
    4: ("ALTER TABLE claims ADD COLUMN interface TEXT",),  # transparent mode (addons/fence.py)
}
# Previous values kept for scrubbing (proxy.store.live); added beside schema 1, so created when absent
# on open whatever the file's age. A row is a superseded credentials.value, copied sealed as it was.
_HISTORY = """CREATE TABLE IF NOT EXISTS credential_history (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL, superseded_at REAL NOT NULL,
      key_id TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (claim_id, name, version),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
_HISTORY_OF = """SELECT key_id, value, version, superseded_at FROM credential_history
    WHERE claim_id = ? AND name = ? ORDER BY version DESC"""
# A credential's OAuth token capture (proxy.core.oauth), beside it like credential_history.
_OAUTH = """CREATE TABLE IF NOT EXISTS credential_oauth (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
# Request counts of rules-file credentials' budgets (their claims live in the rules file, not
# here: no foreign key). Created when absent on open, like credential_history.
_RULES_BUDGETS = """CREATE TABLE IF NOT EXISTS rules_budgets (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, requests_used INTEGER NOT NULL,
      PRIMARY KEY (claim_id, name)) STRICT"""
HISTORY_SECONDS = 24 * 3600.0  # proxy.store.live.LIVE_SECONDS: how long a superseded value is kept
HISTORY_VERSIONS = 8  # proxy.store.live.LIVE_VERSIONS: at most this many per credential
# Whole statements, never built from strings: the column lists are spelled out in each.
_CLAIMS = "SELECT id, pool, sources, version, created_at, updated_at, interface FROM claims"
_CLAIM = _CLAIMS + " WHERE id = ?"
_CREDS = """SELECT claim_id, name, hosts, inject_header, inject_format, placeholder, version, created_at,
    updated_at, expires_at, last_used_at, surfaces, on_misplaced, max_requests, requests_used,
    headers, basic_parts FROM credentials"""
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
_PATCHABLE = frozenset(
    {
        "value",
        "hosts",
        "inject_header",
        "inject_format",
        "expires_at",
        "placeholder",
        "surfaces",
        "on_misplaced",
        "max_requests",
        "headers",
        "basic_parts",
    }
)
_TOUCH_EVERY = 1.0  # seconds: last_used_at is a hint, not worth an fsync per request
_BUSY_MS = 5000


class StoreError(SurrogateError):
    """The credential store cannot do what was asked."""


class NotFound(StoreError):
    """No such claim or credential."""


class Conflict(StoreError):
    """A claim id or placeholder is already taken."""


class PreconditionFailed(StoreError):
    """``if_match`` did not equal the stored version; ``current`` is that version (None: absent)."""

    def __init__(self, current: int | None, message: str) -> None:
        self.current = current
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    id: str
    pool: str
    sources: tuple[str, ...]  # canonical networks, for transparent mode
    version: int  # bumps on every change of the claim, token rotation included
    created_at: float
    updated_at: float
    interface: str | None = None  # transparent mode: the interface its connections must arrive on


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    claim_id: str
    name: str
    hosts: tuple[str, ...]
    inject_header: str | None
    inject_format: str | None
    placeholder: str
    version: int  # 1 on create, +1 on every change of value or metadata
    created_at: float
    updated_at: float
    expires_at: float | None  # stored, not enforced here: the proxy decides what expiry means
    last_used_at: float | None
    surfaces: tuple[str, ...] | None = None  # None: the default surfaces (proxy.core.policy)
    on_misplaced: str | None = None  # None: carry
    max_requests: int | None = None  # the request budget; None: none
    requests_used: int = 0  # requests that carried the secret (see spend())
    headers: tuple[str, ...] | None = None  # header slots, lower-cased; None: slots.DEFAULT_HEADERS
    basic_parts: tuple[str, ...] | None = None  # Basic slots; None: the password only


class CredentialStore(Protocol):
    """What the proxy and the control API need of a store (SQLite here; a server database later)."""

    def close(self) -> None: ...
    def create_claim(
        self, claim_id: str, pool: str, sources: Sequence[str] = (), interface: str | None = None
    ) -> tuple[ClaimRecord, str]: ...
    def get_claim(self, claim_id: str) -> ClaimRecord | None: ...
    def list_claims(self) -> list[ClaimRecord]: ...
    def check_token(self, claim_id: str, token: str) -> bool: ...
    def rotate_token(self, claim_id: str) -> tuple[ClaimRecord, str]: ...
    def delete_claim(self, claim_id: str) -> bool: ...
    def put_credential(
        self, claim_id: str, name: str, *, value: bytes, hosts: Sequence[str],
        inject_header: str | None = None, inject_format: str | None = None,
        placeholder: str | None = None, expires_at: float | None = None, if_match: int | None = None,
        surfaces: Sequence[str] | None = None, on_misplaced: str | None = None,
        max_requests: int | None = None, headers: Sequence[str] | None = None,
        basic_parts: Sequence[str] | None = None,
    ) -> CredentialRecord: ...  # fmt: skip
    def patch_credential(
        self, claim_id: str, name: str, *, if_match: int | None = None, **changes: Any
    ) -> CredentialRecord: ...
    def get_credential(self, claim_id: str, name: str) -> CredentialRecord | None: ...
    def list_credentials(self, claim_id: str) -> list[CredentialRecord]: ...
    def delete_credential(self, claim_id: str, name: str, if_match: int | None = None) -> bool: ...
    def secret(self, claim_id: str, name: str) -> tuple[bytes, int]: ...
    def previous_secrets(self, claim_id: str, name: str) -> list[tuple[bytes, int, float]]: ...
    def set_oauth(self, claim_id: str, name: str, spec: dict[str, Any] | None) -> None: ...
    def oauth_specs(self) -> dict[tuple[str, str], dict[str, Any]]: ...
    def touch_used(self, claim_id: str, name: str, at: float) -> None: ...
    def spend(self, claim_id: str, name: str) -> bool: ...
    def spend_rules_budgets(self, claim_id: str, budgets: Sequence[tuple[str, int]]) -> str | None: ...
    def data_version(self) -> int: ...
    def snapshot(self) -> tuple[list[ClaimRecord], list[CredentialRecord]]: ...
    def rotate_keys(self, new_key: bool = True) -> int: ...


def _claim(row: tuple[Any, ...]) -> ClaimRecord:
    return ClaimRecord(row[0], row[1], tuple(json.loads(row[2])), *row[3:])


def _cred(row: tuple[Any, ...]) -> CredentialRecord:
    surfaces = None if row[11] is None else tuple(json.loads(row[11]))
    (
        claim_id,
        name,
        hosts,
        header,
        fmt,
        placeholder,
        version,
        created,
        updated,
        expires,
        used,
        _,
        misplaced,
        max_requests,
        requests_used,
        slot_headers,
        slot_parts,
    ) = row
    return CredentialRecord(
        claim_id, name, tuple(json.loads(hosts)), header, fmt, placeholder, version, created, updated,
        expires, used, surfaces, misplaced, max_requests, requests_used,
        None if slot_headers is None else tuple(json.loads(slot_headers)),
        None if slot_parts is None else tuple(json.loads(slot_parts)),
    )  # fmt: skip


def _aad(claim_id: str, name: str, version: int) -> bytes:
    return f"{claim_id}\0{name}\0{version}".encode()


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()  # a 256-bit random token needs no slow hash


def _check_ids(claim_id: str, name: str = "-") -> None:
    if not claim_id or not name or "\0" in claim_id + name:  # NUL separates the AAD's parts
        raise ValueError("claim ids and credential names must be non-empty and free of NUL")


def _strings(what: str, items: Iterable[str]) -> tuple[str, ...]:
    if isinstance(items, str | bytes) or not all(isinstance(i, str) for i in items):
        raise TypeError(f"{what} must be a sequence of strings")
    return tuple(items)


def _sources(sources: Sequence[str]) -> list[str]:
    out: list[str] = []
    for s in _strings("sources", sources):
        try:
            net = ipaddress.ip_network(s, strict=False).compressed
        except ValueError:
            raise ValueError(f"source {s!r} is not an IP address or CIDR network") from None
        out += [] if net in out else [net]
    return out


def _surfaces(items: Iterable[str]) -> tuple[str, ...]:
    names = _strings("surfaces", items)
    if unknown := [n for n in names if n not in SURFACES]:
        raise ValueError(f"unknown surface {unknown[0]!r}; expected some of: {', '.join(SURFACES)}")
    order = [str(s) for s in SURFACES]
    return tuple(sorted(set(names), key=order.index))


def _placeholder(text: str) -> str:
    if not isinstance(text, str) or not placeholders.is_placeholder(text):
        raise ValueError(
            f"placeholder {text!r} is not of the recognisable format: "
            f"{placeholders.PREFIX} then 16 to 64 ASCII letters or digits"
        )
    return text


STORE_FILE = "store.sqlite3"
KEY_FILE = "store.key"


def open_state_store(state_dir: Path, create: bool = True) -> Store:
    """The state dir's store (``store.sqlite3``) under its key file (``store.key``, 0600).

    ``create=False`` refuses (ValueError) a state dir that has no store yet, instead of making one.
    """
    db, key = state_dir / STORE_FILE, state_dir / KEY_FILE
    if not create:
        for path in (db, key):
            if not path.is_file():
                raise ValueError(f"{state_dir}: no credential store there ({path.name} is missing)")
    return Store.open(db, KeyRing.load_or_create(key))


class Store:
    """The SQLite credential store: one connection, safe to share between threads."""

    def __init__(self, db: sqlite3.Connection, keyring: KeyRing, path: Path) -> None:
        self.path = path
        self._db = db
        self._keyring = keyring
        self._lock = threading.RLock()
        self._commits = 0  # PRAGMA data_version ignores this connection's own commits
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
            if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                with store._write():
                    found = db.execute("PRAGMA user_version").fetchone()[0]
                    if not 0 <= found <= SCHEMA_VERSION:
                        raise StoreError(
                            f"store {path} has schema version {found}; "
                            f"this surrogate reads up to {SCHEMA_VERSION}"
                        )
                    for statement in _SCHEMA if found == 0 else ():
                        db.execute(statement)
                    for step in range(max(found, 1), SCHEMA_VERSION):
                        for statement in _MIGRATIONS[step]:
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"credential_history", "credential_oauth", "rules_budgets"} <= have:
                with store._write():
                    db.execute(_HISTORY)
                    db.execute(_OAUTH)
                    db.execute(_RULES_BUDGETS)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
                self._keyring.refresh()
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._commits += 1

    def _one(self, sql: str, *args: object) -> Any:
        with self._lock:
            return self._db.execute(sql, args).fetchone()

    # --- claims -------------------------------------------------------------------------------

    def create_claim(
        self, claim_id: str, pool: str, sources: Sequence[str] = (), interface: str | None = None
    ) -> tuple[ClaimRecord, str]:
        """Create a claim; returns it and its proxy token (shown once: only a hash is stored).
        ``interface`` binds its transparent connections to one arrival interface; it needs
        ``sources`` (ValueError otherwise, or for a name that is no interface name)."""
        _check_ids(claim_id)
        nets = _sources(sources)
        if interface is not None:
            if not isinstance(interface, str) or not INTERFACE_NAME.match(interface):
                raise ValueError(f"{interface!r} is not an interface name (1-15 of A-Z a-z 0-9 _ . @ -)")
            if not nets:
                raise ValueError("interface needs sources: it binds the claim's source addresses")
        token, now = secrets.token_urlsafe(32), time.time()
        with self._write() as db:
            if db.execute("SELECT 1 FROM claims WHERE id = ?", (claim_id,)).fetchone():
                raise Conflict(f"claim {claim_id!r} already exists")
            row = (claim_id, pool, json.dumps(nets), _token_hash(token), now, now, interface)
            db.execute(
                "INSERT INTO claims (id, pool, sources, token_hash, version, created_at, updated_at,"
                " interface) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                row,
            )
            return _claim(db.execute(_CLAIM, (claim_id,)).fetchone()), token

    def get_claim(self, claim_id: str) -> ClaimRecord | None:
        row = self._one(_CLAIM, claim_id)
        return _claim(row) if row else None

    def list_claims(self) -> list[ClaimRecord]:
        with self._lock:
            return [_claim(r) for r in self._db.execute(_CLAIMS + " ORDER BY id")]

    def check_token(self, claim_id: str, token: str) -> bool:
        """True when ``token`` is the claim's proxy token (constant-time compare)."""
        row = self._one("SELECT token_hash FROM claims WHERE id = ?", claim_id)
        return hmac.compare_digest(_token_hash(token), row[0] if row else bytes(32)) and row is not None

    def rotate_token(self, claim_id: str) -> tuple[ClaimRecord, str]:
        """Replace the claim's proxy token; the old one stops working at once."""
        token = secrets.token_urlsafe(32)
        with self._write() as db:
            sql = "UPDATE claims SET token_hash = ?, version = version + 1, updated_at = ? WHERE id = ?"
            if not db.execute(sql, (_token_hash(token), time.time(), claim_id)).rowcount:
                raise NotFound(f"claim {claim_id!r} not found")
            return _claim(db.execute(_CLAIM, (claim_id,)).fetchone()), token

    def delete_claim(self, claim_id: str) -> bool:
        """Delete a claim and all its credentials; False when it did not exist."""
        with self._write() as db:
            return db.execute("DELETE FROM claims WHERE id = ?", (claim_id,)).rowcount > 0

    # --- credentials --------------------------------------------------------------------------

    def put_credential(
        self, claim_id: str, name: str, *, value: bytes, hosts: Sequence[str],
        inject_header: str | None = None, inject_format: str | None = None,
        placeholder: str | None = None, expires_at: float | None = None, if_match: int | None = None,
        surfaces: Sequence[str] | None = None, on_misplaced: str | None = None,
        max_requests: int | None = None, headers: Sequence[str] | None = None,
        basic_parts: Sequence[str] | None = None,
    ) -> CredentialRecord:  # fmt: skip
        """Create or replace a credential; ``if_match`` makes it a compare-and-set on the version.
        A replaced credential's request count starts again at 0 (a PATCH keeps it)."""
        _check_ids(claim_id, name)
        if not isinstance(value, bytes):
            raise TypeError("value must be bytes")
        fields: dict[str, Any] = {"value": value, "hosts": hosts, "inject_header": inject_header,
                                  "inject_format": inject_format, "expires_at": expires_at,
                                  "surfaces": surfaces, "on_misplaced": on_misplaced,
                                  "max_requests": max_requests, "requests_used": 0,
                                  "headers": headers, "basic_parts": basic_parts}  # fmt: skip
        if placeholder is not None:
            fields["placeholder"] = placeholder
        with self._write() as db:
            if not db.execute("SELECT 1 FROM claims WHERE id = ?", (claim_id,)).fetchone():
                raise NotFound(f"claim {claim_id!r} not found")
            old = self._current(db, claim_id, name, if_match, must_exist=False)
            if old is None:  # a stand-in at version 0, so that creating is replacing nothing
                now = time.time()
                old = CredentialRecord(
                    claim_id, name, (), None, None, placeholders.generate(), 0, now, now, None, None
                )
            return self._save(db, old, fields)

    def patch_credential(
        self, claim_id: str, name: str, *, if_match: int | None = None, **changes: Any
    ) -> CredentialRecord:
        """Change some of value, hosts, inject_header, inject_format, expires_at, placeholder,
        surfaces, on_misplaced, max_requests, headers, basic_parts.

        None clears inject_header, inject_format or expires_at, and sets surfaces,
        on_misplaced, headers and basic_parts back to their defaults; value, hosts and placeholder
        cannot be cleared. An empty patch changes nothing (and keeps the version).
        """
        if unknown := sorted(set(changes) - _PATCHABLE):
            raise TypeError(f"patch_credential() cannot change {', '.join(unknown)}")
        if cleared := sorted(
            k for k in ("value", "hosts", "placeholder") if k in changes and changes[k] is None
        ):
            raise ValueError(f"{', '.join(cleared)} cannot be cleared")
        with self._write() as db:
            old = self._current(db, claim_id, name, if_match, must_exist=True)
            assert old is not None
            return self._save(db, old, changes) if changes else old

    def get_credential(self, claim_id: str, name: str) -> CredentialRecord | None:
        row = self._one(_CRED, claim_id, name)
        return _cred(row) if row else None

    def list_credentials(self, claim_id: str) -> list[CredentialRecord]:
        with self._lock:
            return [_cred(r) for r in self._db.execute(_CREDS_OF, (claim_id,))]

    def delete_credential(self, claim_id: str, name: str, if_match: int | None = None) -> bool:
        """Delete a credential; False when absent (PreconditionFailed(None) if ``if_match`` was given)."""
        with self._write() as db:
            if self._current(db, claim_id, name, if_match, must_exist=False) is None:
                return False
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
            db.execute("DELETE FROM credential_oauth WHERE claim_id = ? AND name = ?", (claim_id, name))
            if spec is not None:
                db.execute(
                    "INSERT INTO credential_oauth VALUES (?, ?, ?)", (claim_id, name, json.dumps(spec))
                )

    def oauth_specs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every declared token capture, by (claim id, credential name)."""
        with self._lock:
            rows = self._db.execute("SELECT claim_id, name, spec FROM credential_oauth").fetchall()
        return {(c, n): json.loads(spec) for c, n, spec in rows}

    def previous_secrets(self, claim_id: str, name: str) -> list[tuple[bytes, int, float]]:
        """The kept previous values of a credential: (value, version, superseded_at), newest
        first. Raises DecryptError when one does not decrypt."""
        with self._lock:
            rows = self._db.execute(_HISTORY_OF, (claim_id, name)).fetchall()
        return [(self._decrypt(claim_id, name, k, v, ver), ver, at) for k, v, ver, at in rows]

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

    def spend(self, claim_id: str, name: str) -> bool:
        """Count one request that carries this credential's secret. False (nothing counted) when
        its budget is spent or the credential is gone; True when it had room, or has no budget
        (nothing is written then).

        One committed (fsynced) write per request of a metered credential, so the count survives
        ``kill -9``; like :meth:`touch_used` it does not move this process's :meth:`data_version`.
        Raises StoreError when the write fails (the caller refuses the request).
        """
        with self._lock:
            try:
                cur = self._db.execute(
                    "UPDATE credentials SET requests_used = requests_used + 1 WHERE claim_id = ? "
                    "AND name = ? AND max_requests IS NOT NULL AND requests_used < max_requests",
                    (claim_id, name),
                )
                if cur.rowcount:
                    return True
                row = self._db.execute(
                    "SELECT max_requests FROM credentials WHERE claim_id = ? AND name = ?", (claim_id, name)
                ).fetchone()
            except sqlite3.Error as e:
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
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for name, max_requests in budgets:
                    cur = self._db.execute(
                        "INSERT INTO rules_budgets SELECT ?1, ?2, 1 WHERE ?3 >= 1 "
                        "ON CONFLICT (claim_id, name) DO UPDATE SET requests_used = requests_used + 1 "
                        "WHERE requests_used < ?3",
                        (claim_id, name, max_requests),
                    )
                    if not cur.rowcount:
                        self._db.execute("ROLLBACK")
                        return name
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StoreError(f"cannot count a use of credentials of claim {claim_id!r}: {e}") from None
        return None

    # --- change detection and key rotation ----------------------------------------------------

    def data_version(self) -> int:
        """A number that changes after any commit to the file, by this or another connection."""
        return int(self._one("PRAGMA data_version")[0]) + self._commits

    def snapshot(self) -> tuple[list[ClaimRecord], list[CredentialRecord]]:
        """Every claim and credential, read in one transaction (a consistent view)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                claims = [_claim(r) for r in self._db.execute(_CLAIMS + " ORDER BY id")]
                creds = [_cred(r) for r in self._db.execute(_CREDS + " ORDER BY claim_id, name")]
            finally:
                self._db.execute("COMMIT")
        return claims, creds

    def rotate_keys(
        self, new_key: bool = True, *, batch_size: int = 100, max_batches: int | None = None
    ) -> int:
        """Re-encrypt every value under a new current key; returns how many were re-encrypted.

        ``new_key=False`` resumes an interrupted rotation. Each batch is its own transaction, so a
        writer waits at most one batch; ``max_batches`` stops early, leaving the rotation to be
        resumed. When no value uses a non-current key any more, those keys are retired.
        """
        if new_key:
            self._keyring.add_key()
        done = 0
        for _ in itertools.count() if max_batches is None else range(max_batches):
            with self._write() as db:
                sql = (
                    "SELECT claim_id, name, key_id, value, version FROM credentials WHERE key_id != ? LIMIT ?"
                )
                rows = db.execute(sql, (self._keyring.current, batch_size)).fetchall()
                for claim_id, name, key_id, blob, version in rows:
                    plain = self._decrypt(claim_id, name, key_id, blob, version)
                    kid, blob = self._keyring.encrypt(plain, _aad(claim_id, name, version))
                    sql = "UPDATE credentials SET key_id = ?, value = ? WHERE claim_id = ? AND name = ?"
                    db.execute(sql, (kid, blob, claim_id, name))
                sql = (
                    "SELECT claim_id, name, key_id, value, version FROM credential_history "
                    "WHERE key_id != ? LIMIT ?"
                )
                old = db.execute(sql, (self._keyring.current, batch_size)).fetchall()
                for claim_id, name, key_id, blob, version in old:
                    plain = self._decrypt(claim_id, name, key_id, blob, version)
                    kid, blob = self._keyring.encrypt(plain, _aad(claim_id, name, version))
                    sql = (
                        "UPDATE credential_history SET key_id = ?, value = ? "
                        "WHERE claim_id = ? AND name = ? AND version = ?"
                    )
                    db.execute(sql, (kid, blob, claim_id, name, version))
                rows += old
            done += len(rows)
            if not rows:
                break
        else:
            return done  # stopped by max_batches: old keys are still needed
        with self._write() as db:  # writers re-read the key file inside their own transaction
            used = {r[0] for r in db.execute("SELECT DISTINCT key_id FROM credentials")}
            used |= {r[0] for r in db.execute("SELECT DISTINCT key_id FROM credential_history")}
            for kid in set(self._keyring.key_ids) - used - {self._keyring.current}:
                self._keyring.retire(kid)
        return done

    # --- helpers ------------------------------------------------------------------------------

    def _current(
        self, db: sqlite3.Connection, claim_id: str, name: str, if_match: int | None, *, must_exist: bool
    ) -> CredentialRecord | None:
        row = db.execute(_CRED, (claim_id, name)).fetchone()
        old = _cred(row) if row else None
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
            return self._keyring.decrypt(key_id, blob, _aad(claim_id, name, version))
        except DecryptError as e:
            raise DecryptError(f"credential {name!r} of claim {claim_id!r}: {e}") from None

    def _keep_previous(self, db: sqlite3.Connection, old: CredentialRecord, sealed: tuple[Any, ...]) -> None:
        """Keep ``old``'s superseded value (sealed as it was) and drop what is past keeping."""
        now, key = time.time(), (old.claim_id, old.name)
        db.execute(
            "INSERT OR REPLACE INTO credential_history VALUES (?, ?, ?, ?, ?, ?)",
            (*key, old.version, now, sealed[0], sealed[1]),
        )
        db.execute("DELETE FROM credential_history WHERE superseded_at < ?", (now - HISTORY_SECONDS,))
        db.execute(
            "DELETE FROM credential_history WHERE claim_id = ? AND name = ? AND version NOT IN "
            "(SELECT version FROM credential_history WHERE claim_id = ? AND name = ? "
            "ORDER BY version DESC LIMIT ?)",
            (*key, *key, HISTORY_VERSIONS),
        )

    def _save(
        self, db: sqlite3.Connection, old: CredentialRecord, changes: dict[str, Any]
    ) -> CredentialRecord:
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
        if "hosts" in changes:
            changes["hosts"] = _strings("hosts", changes["hosts"])
        if changes.get("surfaces") is not None:
            changes["surfaces"] = _surfaces(changes["surfaces"])
        if changes.get("headers") is not None:
            changes["headers"] = tuple(
                sorted(slots.normalise_headers(_strings("headers", changes["headers"])))
            )
        if changes.get("basic_parts") is not None:
            parts = slots.basic_parts(_strings("basic_parts", changes["basic_parts"]))
            changes["basic_parts"] = tuple(str(p) for p in slots.BASIC_PARTS if p in parts)
        if changes.get("on_misplaced") is not None and changes["on_misplaced"] not in set(Misplaced):
            raise ValueError(
                f"on_misplaced {changes['on_misplaced']!r} is not one of: {', '.join(Misplaced)}"
            )
        placeholder = _placeholder(changes.get("placeholder", old.placeholder))
        sql = (
            "SELECT claim_id, name FROM credentials WHERE placeholder = ? AND NOT (claim_id = ? AND name = ?)"
        )
        if owner := db.execute(sql, (placeholder, old.claim_id, old.name)).fetchone():
            raise Conflict(
                f"placeholder {placeholder} is already used by credential {owner[1]!r} of claim {owner[0]!r}"
            )
        now = time.time()
        stamps = {"updated_at": now, "created_at": now if old.version == 0 else old.created_at}
        new = CredentialRecord(**{**asdict(old), **changes, **stamps, "version": old.version + 1})
        key_id, blob = self._keyring.encrypt(value, _aad(new.claim_id, new.name, new.version))
        surfaces = None if new.surfaces is None else json.dumps(new.surfaces)
        row = {
            **asdict(new),
            "hosts": json.dumps(new.hosts),
            "surfaces": surfaces,
            "headers": None if new.headers is None else json.dumps(new.headers),
            "basic_parts": None if new.basic_parts is None else json.dumps(new.basic_parts),
            "key_id": key_id,
            "value": blob,
        }
        db.execute(_UPSERT, row)
        return new
