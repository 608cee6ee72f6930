"""What a store credential's kind (proxy.store.kinds) makes of the core's credential: the fields
:class:`proxy.core.policy.Credential` takes beyond a static value, built once per row version by
the registry.

- ``aws_sigv4``: re-signed, never swapped as a string (no surfaces, no injection); its sealed
  value is the real keys' JSON, read by the signer.
- ``hmac``: signed with the sealed value (no injection).
- ``oauth_client``: the value injected is the minted token (the slot); the sealed value is what
  it is minted with; grant ``refresh_token`` reads and keeps its refresh token in the store
  (:class:`StoreRefresh`), so a rotated one survives a restart and every worker uses the newest.

A stored spec that no longer parses fails closed: the credential keeps its kind, swaps nowhere
and its value is unavailable (a request with its placeholder is refused), never sent as a static
value (its sealed value may be JSON of several secrets).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.core import mint
from proxy.core.errors import SecretUnavailable, SurrogateError
from proxy.core.policy import Injection, SecretSource
from proxy.core.secrets import Secret
from proxy.store.kinds import parts

if TYPE_CHECKING:
    from proxy.store.base import CredentialRecord, CredentialStore
    from proxy.store.freshness import Freshness

log = logging.getLogger(__name__)
RECHECK = 5.0  # seconds a refresh token read for scrubbing is answered from memory
LEASE_TTL = 30.0  # above addons/mint.py's 10 s token request timeout: a dead holder's bound
LEASE_WAIT = 15.0  # a waiter mints anyway after this (the endpoint then decides)
DEFAULT_INJECT = Injection("Authorization", "Bearer {value}")  # proxy.rules.kinds.DEFAULT_INJECT


@dataclass(slots=True)
class StoreRefresh:
    """An oauth_client credential's refresh token in the store (sealed, credential_tokens).
    :meth:`current` (response scrubbing) answers from memory, read again at most every
    :data:`RECHECK` seconds (another worker may have rotated it); :meth:`latest` (before a mint)
    reads the store; :meth:`keep` seals a rotated one."""

    store: CredentialStore = field(repr=False)
    claim_id: str
    name: str
    freshness: Freshness | None = field(default=None, repr=False, compare=False)
    _cached: Secret | None = field(default=None, repr=False)
    _read_at: float = field(default=float("-inf"), repr=False, compare=False)

    def _who(self) -> str:
        return f"refresh token of credential {self.name!r} of claim {self.claim_id!r}"

    def latest(self) -> Secret | None:
        if self.freshness is not None and self.freshness.failing:
            raise SecretUnavailable(f"{self._who()} cannot be read: the store is unreachable")
        try:
            raw = self.store.refresh_token(self.claim_id, self.name)
        except SurrogateError as e:
            raise SecretUnavailable(f"{self._who()} cannot be read: {type(e).__name__}") from None
        if raw is not None:
            self._cached = Secret(raw.decode("utf-8", "replace"))
        return self._cached

    def current(self) -> tuple[Secret, int]:
        now = time.monotonic()
        if self._cached is None or now - self._read_at >= RECHECK:  # another worker may have rotated it
            self._read_at = now
            with contextlib.suppress(SecretUnavailable):
                self.latest()
        if self._cached is None:
            raise SecretUnavailable(f"{self._who()} is not set")
        return self._cached, 0

    def keep(self, token: Secret) -> None:
        self.store.keep_refresh_token(self.claim_id, self.name, token.reveal().encode())
        self._cached = token

    def hold(self) -> AbstractContextManager[bool]:
        """The store's lease on minting this credential (every worker and node of the store)."""
        return self.store.lease(f"mint:{self.claim_id}/{self.name}", LEASE_TTL, LEASE_WAIT)


@dataclass(frozen=True, slots=True)
class _Unavailable:
    name: str

    def current(self) -> tuple[Secret, int]:
        raise SecretUnavailable(f"credential {self.name!r}: its stored kind is unreadable")


def fields(
    r: CredentialRecord, store: CredentialStore, value: SecretSource, freshness: Freshness | None
) -> dict[str, Any]:
    """The Credential keyword arguments of record ``r``'s kind (empty for ``static``)."""
    if r.kind == "static":
        return {}
    try:
        doc = json.loads(r.spec or "null")
        if not isinstance(doc, dict):
            raise ValueError("spec is not an object")
        made = parts(r.kind, doc)
    except (ValueError, TypeError) as e:
        log.warning("credential %r of claim %r: stored kind unreadable: %s", r.name, r.claim_id, e)
        return {"kind": r.kind, "source": _Unavailable(r.name), "surfaces": frozenset(), "inject": None}
    if made.sigv4 is not None:
        return {"kind": r.kind, "sigv4": made.sigv4, "surfaces": frozenset(), "inject": None}
    if made.sign is not None:
        return {"kind": r.kind, "sign": made.sign, "inject": None}
    assert made.mint is not None
    kept = StoreRefresh(store, r.claim_id, r.name, freshness) if made.mint.grant == "refresh_token" else None
    minting = mint.Minting(made.mint, value, kept, kept=kept)
    inject = Injection(r.inject_header, r.inject_format or "{value}") if r.inject_header else DEFAULT_INJECT
    return {"kind": r.kind, "mint": minting, "source": minting.slot, "inject": inject}
