"""The credential store's interface: its records, its errors, and the operations every backend
(:mod:`proxy.store.sqlite`, :mod:`proxy.store.postgres`) implements.

Errors::

    SurrogateError (proxy.core.errors)
    ├── StoreError               the store cannot be used (newer schema, not a database, busy, down)
    │   ├── NotFound             no such claim / credential
    │   ├── Conflict             id or placeholder already taken; names the owner, never a value
    │   └── PreconditionFailed   ``if_match`` is stale; ``current`` is the version now (None: absent)
    ├── KeyFileError (keyring)   the key file is unsafe or malformed
    └── DecryptError (keyring)   a stored value does not decrypt

Bad arguments (a malformed source, placeholder or id; a value that is not bytes) raise ValueError
or TypeError before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
