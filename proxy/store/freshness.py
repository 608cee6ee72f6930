"""How current a node's copy of the shared store is: the staleness bound (issue 14).

A node serves run-time claims from its copy of the store (:class:`proxy.store.registry.Registry`).
:class:`Freshness` records when that copy was last *known* current (a read of the store's version
that succeeded: in ``sync=strict`` mode the read itself, in ``sync=notify`` mode the watcher's
last confirmation, :meth:`proxy.store.postgres.PostgresStore.data_version_at`) and answers:

- ``never_synced``: the store was never read since the process started (a node started while
  the database is down): store claims are unknown, their requests are refused
  (``store_never_synced``);
- ``stale``: the copy was last known current more than ``bound`` seconds ago (the database is
  unreachable): store claims' requests are refused (``store_stale``) and their tunnels closed,
  as nothing the node holds of them (the claim, its token, its credentials) can be known current;
- None: within the bound; the copy is served (the last-known-good copy while the store fails).

``bound`` None (the node-local SQLite store) never goes stale. After a failed read the store
is not asked again for ``RETRY`` seconds, and value and token reads that would wait for the
database are answered from the copy alone (:attr:`failing`): an outage costs the event loop one
bounded wait a second, not one per request.

Times are ``time.monotonic()`` seconds, passed in (the caller owns the clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

NEVER_SYNCED: Final = "never_synced"
STALE: Final = "stale"
RETRY = 1.0  # seconds between reads of a store that failed

type State = Literal["never_synced", "stale"] | None


@dataclass(slots=True)
class Freshness:
    bound: float | None = None  # seconds; None: never stale
    synced_at: float | None = None  # when the copy was last known current
    version: int | None = None  # the store version the copy is at
    failing: bool = False  # the last read of the store failed
    _retry_at: float = float("-inf")

    def state(self, now: float) -> State:
        """``never_synced``, ``stale`` or None (current, or within the bound)."""
        if self.synced_at is None:
            return NEVER_SYNCED
        if self.bound is not None and now - self.synced_at > self.bound:
            return STALE
        return None

    def may_read(self, now: float) -> bool:
        """Whether to ask the store now (not within ``RETRY`` seconds of a failure)."""
        return now >= self._retry_at

    def synced(self, version: int, known_at: float) -> None:
        """The store was read: the copy is at ``version``, current as of ``known_at``."""
        self.version, self.failing, self._retry_at = version, False, float("-inf")
        if self.synced_at is None or known_at > self.synced_at:
            self.synced_at = known_at

    def failed(self, now: float) -> None:
        self.failing, self._retry_at = True, now + RETRY
