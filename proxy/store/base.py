"""The credential store's interface: its records, its errors, and the operations every backend
(:mod:`proxy.store.sqlite`, :mod:`proxy.store.postgres`) implements.

Errors::

    SurrogateError (proxy.core.errors)
    ├── StoreError               the store cannot be used (newer schema, not a database, busy, down)
    │   ├── NotFound             no such claim / credential
    │   ├── Conflict             id or placeholder already taken; names the owner, never a value;
    │   │                        or an approval that is no longer pending (decided twice)
    │   └── PreconditionFailed   ``if_match`` is stale; ``current`` is the version now (None: absent)
    ├── KeyFileError (keyring)   the key file is unsafe or malformed
    └── DecryptError (keyring)   a stored value does not decrypt

Bad arguments (a malformed source, placeholder or id; a value that is not bytes) raise ValueError
or TypeError before anything is written.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, Self

from proxy.core.errors import SurrogateError

HISTORY_SECONDS = 24 * 3600.0  # proxy.store.live.LIVE_SECONDS: how long a superseded value is kept
HISTORY_VERSIONS = 8  # proxy.store.live.LIVE_VERSIONS: at most this many per credential
PATCHABLE = frozenset(
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
    # the credential's kind (issue 15) and its non-secret spec as canonical JSON text, kept in the
    # side table credential_kinds (proxy.store.kinds); the kind's secrets are in the sealed value
    kind: str = "static"
    spec: str | None = None


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed in a store since a version (``changes_since``, PostgreSQL): the rows written
    after it, the claims and credentials removed after it, and every OAuth spec (few, small)."""

    version: int  # the version these changes bring the reader to
    claims: list[ClaimRecord]
    credentials: list[CredentialRecord]
    removed_claims: list[str]
    removed_credentials: list[tuple[str, str]]
    oauth: dict[tuple[str, str], dict[str, Any]]


APPROVAL_STATES = ("pending", "approved", "denied", "timed_out", "withdrawn")
GRANT_SCOPES = ("session", "for", "always")


def new_id() -> str:
    """A random approval or grant id: 22 url-safe characters (128 bits, ``secrets.token_urlsafe``)
    that never begin with ``-``, so the id an operator copies is never read as an option by the CLI
    (``surrogate approvals revoke -0tE…`` was; a stored id that does can still be given after
    ``--``)."""
    while (value := secrets.token_urlsafe(16)).startswith("-"):
        pass
    return value


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One request held for an operator's decision (issue 16; the contract:
    /work/briefs/approvals-contract.md). ``preview`` is the body up to a bound, redacted by the
    node before it is stored: placeholders kept, anything the scrubber would scrub removed."""

    id: str  # random, url-safe, 22 characters, never a leading "-" (new_id())
    claim_id: str
    pool: str
    method: str
    host: str
    port: int
    path: str  # canonical, with its query
    credentials: tuple[str, ...]  # the names the request carries (placeholders found)
    preview: str
    rule: str  # which ask rule (its label: file:line and host)
    scopes: tuple[str, ...]  # offered: once, session, for, always
    created_at: float
    expires_at: float  # the timeout: a pending approval past it is timed out by its node
    state: str = "pending"  # APPROVAL_STATES
    decided_at: float | None = None
    decided_by: str | None = None
    scope: str | None = None  # the chosen scope of an approval ("once", "session", "for:600", "always")
    reason: str | None = None  # why it was withdrawn / timed out
    session: str | None = None  # the claim's session id at the time of asking (a "session" grant's)
    request_id: str | None = None  # the held request's audit id (X-Surrogate-Request-Id)


@dataclass(frozen=True, slots=True)
class GrantRecord:
    """A standing approval: requests of ``claim_id`` to ``host`` with ``method`` under
    ``path_prefix`` (segment-wise) that carry at most ``credentials`` pass without asking, while
    not revoked and before ``expires_at`` (scope "for"), within ``session`` (scope "session"), or
    until revoked (scope "always")."""

    id: str
    claim_id: str
    credentials: tuple[str, ...]
    method: str
    host: str
    port: int
    path_prefix: str
    scope: str  # GRANT_SCOPES
    created_at: float
    expires_at: float | None
    approved_by: str
    session: str | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None
    approval_id: str | None = None  # the approval it came from


class CredentialStore(Protocol):
    """What the proxy (registry, OAuth capture, budgets), the control API and the CLI (key
    rotation) need of a store. Implemented by :class:`proxy.store.sqlite.Store` (one node) and
    :class:`proxy.store.postgres.PostgresStore` (a fleet); ``tests/unit/store/test_conformance.py``
    holds every backend to each promise below.

    Promises of every backend:

    - **Atomic**: each write is one transaction; it happens whole or not at all, and a write that
      raises has changed nothing. Writes are serialised across every process that shares the
      store, so a compare-and-set (``if_match``) is exact: of N concurrent writers with one
      version, exactly one wins, the others get PreconditionFailed with the version now.
    - **Acknowledged = durable**: once a write returns, it survives ``kill -9`` of any process
      (and power loss, as far as the database's own fsync promises).
    - **Visible**: a write moves :meth:`data_version` for every reader of the store (another
      process included) before it returns; budget counts and ``touch_used`` may not. (The
      PostgreSQL store's ``sync=notify`` mode trades this for a bound of milliseconds on other
      nodes, and keeps it for the writing node: :mod:`proxy.store.pgwatch`.)
    - **Sealed**: a value is at rest only as AES-256-GCM under the key ring, bound to ``claim_id
      NUL name NUL version`` (:func:`proxy.store.rows.aad`); a refresh token the same way, bound
      to ``claim_id NUL name NUL refresh_token NUL generation`` (:func:`proxy.store.rows.token_aad`);
      a proxy token only as its SHA-256. No error, repr or log line holds a value or a token.
    - **Budgets**: :meth:`spend` and :meth:`spend_rules_budgets` count in one conditional
      statement of the database: of M concurrent spenders of a budget of N, exactly min(M, N)
      succeed, on every node together.
    """

    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...
    def create_claim(
        self, claim_id: str, pool: str, sources: Sequence[str] = (), interface: str | None = None
    ) -> tuple[ClaimRecord, str]:
        """A new claim at version 1 and its proxy token (shown once; only its hash is kept).
        Conflict if the id exists; ValueError for a bad id, source or interface."""
        ...

    def get_claim(self, claim_id: str) -> ClaimRecord | None: ...
    def list_claims(self) -> list[ClaimRecord]:
        """Every claim, by id."""
        ...

    def check_token(self, claim_id: str, token: str) -> bool:
        """True when ``token`` is the claim's current proxy token (constant-time compare)."""
        ...

    def rotate_token(self, claim_id: str) -> tuple[ClaimRecord, str]:
        """A new token, the claim's version +1; the old token fails from now on. NotFound."""
        ...

    def delete_claim(self, claim_id: str) -> bool:
        """Delete the claim with its credentials, history and OAuth specs; False when absent."""
        ...

    def put_credential(
        self,
        claim_id: str,
        name: str,
        *,
        value: bytes,
        hosts: Sequence[str],
        inject_header: str | None = None,
        inject_format: str | None = None,
        placeholder: str | None = None,
        expires_at: float | None = None,
        if_match: int | None = None,
        surfaces: Sequence[str] | None = None,
        on_misplaced: str | None = None,
        max_requests: int | None = None,
        headers: Sequence[str] | None = None,
        basic_parts: Sequence[str] | None = None,
        kind: str = "static",
        spec: str | None = None,
        refresh_token: bytes | None = None,
    ) -> CredentialRecord:
        """Create (version 1) or replace (version +1, request count back to 0) a credential.
        ``kind`` and ``spec`` (canonical JSON, no secret: proxy.store.kinds) are written in the
        same transaction; ``refresh_token`` (kind oauth_client, grant refresh_token) is sealed
        beside it (replaced: a PUT without one clears it).
        NotFound (no claim), Conflict (placeholder taken), PreconditionFailed (``if_match``
        stale), ValueError / TypeError (bad field). A replaced value is kept sealed in the
        history (at most HISTORY_VERSIONS, HISTORY_SECONDS) for response scrubbing."""
        ...  # fmt: skip

    def patch_credential(
        self, claim_id: str, name: str, *, if_match: int | None = None, **changes: Any
    ) -> CredentialRecord:
        """Change some fields (PATCHABLE; version +1, request count kept); an empty patch
        changes nothing. NotFound, Conflict, PreconditionFailed, ValueError, TypeError."""
        ...

    def get_credential(self, claim_id: str, name: str) -> CredentialRecord | None: ...
    def list_credentials(self, claim_id: str) -> list[CredentialRecord]:
        """The claim's credentials, by name ([] for an unknown claim)."""
        ...

    def delete_credential(self, claim_id: str, name: str, if_match: int | None = None) -> bool:
        """False when absent (PreconditionFailed(None) when ``if_match`` was given)."""
        ...

    def placeholder_holder(self, claim_id: str, name: str, mine: set[str]) -> tuple[str, str] | None:
        """(placeholder, credential) when another credential of the claim than ``name`` holds one
        of ``mine`` (as its placeholder or in its kind's spec), else None; indexed lookups."""
        ...

    def secret(self, claim_id: str, name: str) -> tuple[bytes, int]:
        """The decrypted value and its version. NotFound, DecryptError."""
        ...

    def previous_secrets(self, claim_id: str, name: str) -> list[tuple[bytes, int, float]]:
        """Kept previous values, newest first: (value, version, superseded_at). DecryptError."""
        ...

    def set_oauth(self, claim_id: str, name: str, spec: dict[str, Any] | None) -> None:
        """Declare (a JSON-able dict, proxy.core.oauth) or clear (None) a token capture. NotFound."""
        ...

    def oauth_specs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every declared token capture, by (claim id, credential name)."""
        ...

    def refresh_token(self, claim_id: str, name: str) -> bytes | None:
        """The newest refresh token of an ``oauth_client`` credential (decrypted), None when it has
        none. DecryptError."""
        ...

    def keep_refresh_token(self, claim_id: str, name: str, token: bytes) -> None:
        """Seal a refresh token the token endpoint rotated in, so a restart (and every other
        worker) uses it. NotFound when the credential is gone."""
        ...

    def touch_used(self, claim_id: str, name: str, at: float) -> None:
        """Best effort (at most one write a second per credential, skipped when busy): never
        raises for contention, never stalls a request behind a writer."""
        ...

    def spend(self, claim_id: str, name: str) -> bool:
        """Count one use against ``max_requests``: False (nothing counted) when spent or gone,
        True when counted or unmetered. StoreError when the count cannot be written."""
        ...

    def spend_rules_budgets(self, claim_id: str, budgets: Sequence[tuple[str, int]]) -> str | None:
        """Count one use of rules-file credentials ``(name, max_requests)``, all or none: the
        name of the first that is spent, else None. StoreError when it cannot be written."""
        ...

    def data_version(self) -> int:
        """A number that differs after any write of the store (by any process). StoreError."""
        ...

    def snapshot(self) -> tuple[list[ClaimRecord], list[CredentialRecord]]:
        """Every claim and credential, read in one transaction (a consistent view)."""
        ...

    def lease(self, key: str, ttl: float, wait: float = 0.0) -> AbstractContextManager[bool]:
        """Hold the lease ``key`` (one holder at a time across every process and node of the
        store) for a ``with`` block: True when held, False when another holder kept it past
        ``wait`` seconds; a holder that dies loses it ``ttl`` seconds after taking it
        (:mod:`proxy.store.leases`). ValueError for a bad argument, StoreError when unreachable."""
        ...

    def rotate_keys(self, new_key: bool = True) -> int:
        """Re-encrypt every value under a new key (``new_key=False``: finish an interrupted
        rotation); retires keys no value uses. Returns how many were re-encrypted."""
        ...

    # --- approvals (proxy.store.approvals) ----------------------------------------------------

    def add_approval(self, record: ApprovalRecord, *, max_pending: int | None = None) -> None:
        """Store a new pending approval. Conflict if the id exists, or (a Conflict subclass,
        ``PendingLimit``) when the claim has ``max_pending`` pending ones; ValueError for a bad field."""
        ...

    def approvals(self, state: str | None = "pending") -> list[ApprovalRecord]:
        """Approvals in ``state`` (None: all), oldest first."""
        ...

    def approval(self, approval_id: str) -> ApprovalRecord | None: ...
    def decide_approval(
        self, approval_id: str, verdict: str, scope: str | None, by: str, now: float
    ) -> ApprovalRecord:
        """Approve or deny a pending approval, compare-and-set: of concurrent deciders exactly one
        wins; the others (and any later one) get Conflict naming the state now. NotFound;
        ValueError for a verdict or scope not offered. A pending one past ``expires_at`` is
        timed out here (Conflict)."""
        ...

    def withdraw_approval(
        self, approval_id: str, reason: str, state: str = "withdrawn"
    ) -> ApprovalRecord | None:
        """Close a pending approval (client gone: "withdrawn"; timeout: ``state="timed_out"``);
        None when it was no longer pending (a decision won the race)."""
        ...

    def add_grant(self, record: GrantRecord) -> None: ...
    def grants(self, active_at: float | None = None) -> list[GrantRecord]:
        """Grants, oldest first; with ``active_at``, only those not revoked nor expired then."""
        ...

    def revoke_grant(self, grant_id: str, by: str) -> None:
        """Revoke a grant now (NotFound when absent; revoking twice keeps the first time)."""
        ...

    def matching_grant(
        self,
        claim: str,
        host: str,
        method: str,
        path: str,
        credential_names: Sequence[str],
        now: float,
        *,
        port: int | None = None,
        session: str | None = None,
    ) -> GrantRecord | None:
        """An active grant of ``claim`` for exactly this host (and port, when given) and method,
        whose path prefix covers ``path`` segment-wise, whose credentials include every one of
        ``credential_names``, and (scope "session") whose session is ``session``; else None."""
        ...  # fmt: skip


# The connection shape a backend hands the shared queries (proxy.store.queries): DB-API.
class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """A connection whose ``execute`` takes ``?`` (and ``:name``) parameters."""

    def execute(self, sql: str, params: Any = (), /) -> Cursor: ...
