"""The SQLite store's schema and its migrations (``PRAGMA user_version``, now 5).

Tables (see :mod:`proxy.store.sqlite` for what each column means)::

    claims(id PK, pool, sources JSON, token_hash, version, created_at, updated_at, interface)
    credentials(claim_id -> claims ON DELETE CASCADE, name, PK (claim_id, name), hosts JSON,
                inject_header, inject_format, placeholder UNIQUE, key_id, value, version,
                created_at, updated_at, expires_at, last_used_at, surfaces, on_misplaced,
                max_requests, requests_used, headers, basic_parts)
    credential_history, credential_oauth, credential_kinds, credential_tokens,
        credential_spec_placeholders -> credentials ON DELETE CASCADE; rules_budgets
    approvals, grants (issue 16: proxy.store.approvals)

A new file runs the base schema and then every migration; an older one runs the migrations from
its version on, all in one write transaction, so a failure leaves it at its old version. A
migration only adds columns (``ALTER TABLE ... ADD COLUMN``, nullable or with a default), so an
older store keeps every row and reads as the defaults it was written with. The side tables
(history, OAuth, rules budgets, approvals, grants) need no migration: they are created when
absent on every open.

Errors: :class:`proxy.store.base.StoreError` for a schema newer than this code reads;
``sqlite3.DatabaseError`` passes through (the caller names the file).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.store.base import StoreError

SCHEMA_VERSION = 5
SCHEMA = (
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
# MIGRATIONS[n] takes a store from schema version n to n + 1 (a new store runs them all).
MIGRATIONS: dict[int, tuple[str, ...]] = {
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
HISTORY = """CREATE TABLE IF NOT EXISTS credential_history (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL, superseded_at REAL NOT NULL,
      key_id TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (claim_id, name, version),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
# A credential's OAuth token capture (proxy.core.oauth), beside it like credential_history.
OAUTH = """CREATE TABLE IF NOT EXISTS credential_oauth (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, spec TEXT NOT NULL, PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
# Request counts of rules-file credentials' budgets (their claims live in the rules file, not
# here: no foreign key). Created when absent on open, like credential_history.
RULES_BUDGETS = """CREATE TABLE IF NOT EXISTS rules_budgets (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, requests_used INTEGER NOT NULL,
      PRIMARY KEY (claim_id, name)) STRICT"""
# Leases (proxy.store.leases): one holder at a time of a named job; created when absent on open.
LEASES = """CREATE TABLE IF NOT EXISTS leases (
      key TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL) STRICT"""
# Approvals and grants (issue 16, proxy.store.approvals): side tables, created when absent on open.
APPROVALS = """CREATE TABLE IF NOT EXISTS approvals (
      id TEXT PRIMARY KEY, claim_id TEXT NOT NULL, pool TEXT NOT NULL, method TEXT NOT NULL,
      host TEXT NOT NULL, port INTEGER NOT NULL, path TEXT NOT NULL, credentials TEXT NOT NULL,
      preview TEXT NOT NULL, rule TEXT NOT NULL, scopes TEXT NOT NULL, created_at REAL NOT NULL,
      expires_at REAL NOT NULL, state TEXT NOT NULL, decided_at REAL, decided_by TEXT, scope TEXT,
      reason TEXT, session TEXT, request_id TEXT) STRICT"""
GRANTS = """CREATE TABLE IF NOT EXISTS grants (
      id TEXT PRIMARY KEY, claim_id TEXT NOT NULL, credentials TEXT NOT NULL, method TEXT NOT NULL,
      host TEXT NOT NULL, port INTEGER NOT NULL, path_prefix TEXT NOT NULL, scope TEXT NOT NULL,
      created_at REAL NOT NULL, expires_at REAL, approved_by TEXT NOT NULL, session TEXT,
      revoked_at REAL, revoked_by TEXT, approval_id TEXT) STRICT"""
# Credential kinds (issue 15, proxy.store.kinds): a credential's kind and its non-secret spec
# (JSON), written with the credential in one transaction; and the refresh token of an
# oauth_client credential, sealed like a value (rows.token_aad), rotated in by the token endpoint.
KINDS = """CREATE TABLE IF NOT EXISTS credential_kinds (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL, spec TEXT NOT NULL,
      PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
TOKENS = """CREATE TABLE IF NOT EXISTS credential_tokens (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, generation INTEGER NOT NULL, updated_at REAL NOT NULL,
      key_id TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
# The placeholders an aws_sigv4 spec gives the sandbox beside ``placeholder`` (proxy.store.kinds
# ``spec_placeholders``), one row each, so that a write checks them by index, not by reading every
# spec of the claim; written with the kind row. Created when absent, then filled from the kinds.
SPEC_PLACEHOLDERS = """CREATE TABLE IF NOT EXISTS credential_spec_placeholders (
      claim_id TEXT NOT NULL, name TEXT NOT NULL, placeholder TEXT NOT NULL,
      PRIMARY KEY (claim_id, placeholder),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE) STRICT"""
SIDE_TABLES = {"credential_history": HISTORY, "credential_oauth": OAUTH, "rules_budgets": RULES_BUDGETS,
               "leases": LEASES, "approvals": APPROVALS, "grants": GRANTS,
               "credential_kinds": KINDS, "credential_tokens": TOKENS,
               "credential_spec_placeholders": SPEC_PLACEHOLDERS}  # fmt: skip
SIDE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS credential_spec_placeholders_of "
    "ON credential_spec_placeholders(claim_id, name)",
)
# fills credential_spec_placeholders from the kinds written before it existed
SPEC_PLACEHOLDERS_FILL = (
    """INSERT INTO credential_spec_placeholders SELECT claim_id, name, json_extract(spec,
      '$.secret_placeholder') FROM credential_kinds WHERE kind = 'aws_sigv4'
      AND json_extract(spec, '$.secret_placeholder') IS NOT NULL ON CONFLICT DO NOTHING""",
    """INSERT INTO credential_spec_placeholders SELECT claim_id, name, json_extract(spec,
      '$.session_token_placeholder') FROM credential_kinds WHERE kind = 'aws_sigv4'
      AND json_extract(spec, '$.session_token_placeholder') IS NOT NULL ON CONFLICT DO NOTHING""",
)


def _user_version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def migration_needed(db: sqlite3.Connection) -> bool:
    """True when the file is not at :data:`SCHEMA_VERSION` or lacks a side table."""
    have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return _user_version(db) != SCHEMA_VERSION or not set(SIDE_TABLES) <= have


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the file to :data:`SCHEMA_VERSION`; call inside a write transaction (``BEGIN
    IMMEDIATE``, so that two processes opening one old file do not both migrate it).

    Raises StoreError for a version this code does not know (newer, or negative).
    """
    found = _user_version(db)
    if found != SCHEMA_VERSION:
        if not 0 <= found <= SCHEMA_VERSION:
            raise StoreError(
                f"store {path} has schema version {found}; this surrogate reads up to {SCHEMA_VERSION}"
            )
        for statement in SCHEMA if found == 0 else ():
            db.execute(statement)
        for step in range(max(found, 1), SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    have = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for statement in (*SIDE_TABLES.values(), *SIDE_INDEXES):
        db.execute(statement)
    if "credential_spec_placeholders" not in have:
        for statement in SPEC_PLACEHOLDERS_FILL:
            db.execute(statement)
