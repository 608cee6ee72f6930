"""Leases: one holder at a time of a named job (an OAuth refresh of one credential), across the
threads, processes and nodes that share one store. Mixed into both backends
(:class:`proxy.store.queries.SQLStore`).

Decided: a **lease row with an expiry**, in the store's own database, read against the
database's clock (one clock for every node: no skew between nodes' clocks matters)::

    leases(key PK, holder, expires_at)   -- created when absent on open (a side table)

Taking a lease is one atomic statement, an ``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
leases.expires_at <= now``: it writes a row when there is none or the one there has expired, and
nothing when another holder's row is live (PostgreSQL re-checks the condition on the newest row
after a conflicting insert commits; SQLite runs it under its write lock). Of N concurrent takers
exactly one wins. Giving it back deletes the row only when it is still this holder's (``holder``
is a random id per take), so a holder whose lease expired and was taken over never frees the new
holder's.

A holder that dies (``kill -9``, a node that loses the database) never releases: its row expires
``ttl`` seconds after it was taken and the next taker gets it. So ``ttl`` is the bound on both the
job and a dead holder's hold; a job that may run longer than ``ttl`` is no longer exclusive
after it (the caller picks a ``ttl`` above its own timeout). Advisory locks were considered for
PostgreSQL: they free at once on a dead session, but need a pooled connection held for the whole
job and do not exist in SQLite; a row serves both backends with one set of promises.

Waiting is a bounded poll (10 ms doubling to 200 ms, never past ``wait`` seconds).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

from proxy.store.base import Conn, StoreError

MAX_TTL = 3600.0
MAX_KEY = 200
_FIRST_NAP, _LAST_NAP = 0.01, 0.2
# {now}: the database's clock, seconds since the epoch; filled once per backend class
_TAKE = """INSERT INTO leases (key, holder, expires_at) VALUES (?, ?, {now} + ?)
    ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE leases.expires_at <= {now}"""
_GIVE = "DELETE FROM leases WHERE key = ? AND holder = ?"


def take_statement(now_sql: str) -> str:
    """The take statement of a backend whose clock reads ``now_sql`` (a constant expression)."""
    return _TAKE.format(now=now_sql)


class Leases:
    """:meth:`lease` over a backend's autocommit connection (``_auto``) and its clock."""

    _LEASE_TAKE: ClassVar[str]  # take_statement(the backend's clock)
    _errors: ClassVar[tuple[type[Exception], ...]]

    def _auto(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _try_lease(self, key: str, holder: str, ttl: float) -> bool:
        with self._auto() as db:
            try:
                return bool(db.execute(self._LEASE_TAKE, (key, holder, ttl)).rowcount)
            except self._errors as e:
                raise StoreError(f"cannot take lease {key!r}: {e}") from None

    def _give_lease(self, key: str, holder: str) -> None:
        try:
            with self._auto() as db:
                db.execute(_GIVE, (key, holder))
        except (StoreError, *self._errors):  # type: ignore[misc]  # a tuple of exception classes
            pass  # the row expires within its ttl: a failed give-back delays the next taker only

    @contextmanager
    def lease(self, key: str, ttl: float, wait: float = 0.0) -> Iterator[bool]:
        """Hold the lease ``key`` for the ``with`` block: yields True when held (given back on
        exit, whatever the block raised), False when another holder kept it for ``wait``
        seconds (the block then runs without it: the caller decides). A holder that never
        gives it back (killed) loses it ``ttl`` seconds after taking it.

        ValueError for an empty or over-long key, a ``ttl`` outside (0, 3600] or a negative
        ``wait``; StoreError when the store cannot be reached (nothing is held then).
        """
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
            raise ValueError(f"a lease key is a string of 1 to {MAX_KEY} characters")
        if not 0 < ttl <= MAX_TTL:
            raise ValueError(f"a lease ttl is more than 0 and at most {MAX_TTL:g} seconds")
        if not wait >= 0:
            raise ValueError("a lease wait is 0 or more seconds")
        holder = secrets.token_hex(16)
        deadline, nap = time.monotonic() + wait, _FIRST_NAP
        held = self._try_lease(key, holder, ttl)
        while not held and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(nap, left))
            nap = min(nap * 2, _LAST_NAP)
            held = self._try_lease(key, holder, ttl)
        try:
            yield held
        finally:
            if held:
                self._give_lease(key, holder)
