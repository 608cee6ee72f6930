"""Fleet-wide limits: the arithmetic of a claim's connection and rate limits across nodes that
share one PostgreSQL store (issue 14). Pure: numbers in, numbers out; the SQL and the timer are
:mod:`proxy.store.fleetlimits`.

**Connections.** Each node counts its own exactly (its shared table, every worker) and publishes
its per-claim counts every ``tick`` seconds; it reads the other nodes' sums at the same tick.
A connection is admitted when ``local + others < limit`` (:func:`connection_bound`): ``others``
is what the other nodes had published at this node's last read, from rows whose heartbeat is
younger than ``heartbeat_bound`` (a dead node's connections are given back after it). Tolerance
(:func:`connection_tolerance`): a claim's open connections over the fleet are at most::

    limit + Σ_{other nodes} (connections they admitted in the last 2 × tick + one round trip)

(and never more than ``nodes × limit``): a connection another node admitted after its last
publish, or after this node's last read, is not yet seen here.

**Rate.** A token bucket per claim lives in the database (``rate`` refill, ``burst`` capacity,
refilled by the database's clock). A node leases :func:`batch` tokens at a time in one atomic
statement and spends them locally; when out it leases again. The database's bucket never grants
more than ``burst + rate × T`` in T seconds, so tolerance (:func:`rate_tolerance`): over any T
seconds at most ``burst + rate × T + processes × batch`` requests are admitted fleet-wide, where
``processes`` counts every worker of every node (each holds at most one batch leased before the
window began). The batch is ``max(1, min(burst, floor(rate × 0.25)))``: a quarter of a second of
the rate, never more than the burst, and at least one token, so a claim of rate 1/s is never
starved by tokens stranded on another node for longer than its own refill.

**Database unreachable.** The limits never admit more because the database is gone:
connections keep the other nodes' last-known counts (never forgotten while the read fails);
the rate falls back to a local bucket of ``rate / nodes`` and ``max(1, burst // nodes)``
(:func:`fallback`), ``nodes`` being the live nodes last seen (at least 1), so the fleet together
stays near the claim's rate. Store claims are refused anyway once the copy is stale
(``503 store_stale``, :mod:`proxy.store.freshness`).
"""

from __future__ import annotations

import math

BATCH_SECONDS = 0.25  # a lease is this much of the rate


def connection_bound(limit: int, others: int) -> int:
    """The bound this node's local count must stay under: ``limit`` less the other nodes'
    last-known count, never below 0 (every new connection refused)."""
    return max(0, limit - max(0, others))


def batch(rate: float, burst: int) -> int:
    """Tokens leased at a time for a claim of ``rate`` per second and ``burst``: at least 1,
    at most ``burst``, else a quarter second of the rate."""
    return max(1, min(burst, math.floor(rate * BATCH_SECONDS)))


def lease(
    tokens: float, stamp: float, now: float, rate: float, burst: int, want: int
) -> tuple[int, float, float]:
    """The database's lease statement in Python (the tests hold the SQL to it): the bucket held
    ``tokens`` at ``stamp``; at ``now`` it refills (never past ``burst``, never backwards in
    time) and gives up to ``want`` whole tokens. Returns ``(granted, tokens left, new stamp)``."""
    refilled = min(float(burst), tokens + max(0.0, now - stamp) * rate)
    granted = min(want, math.floor(refilled))
    return granted, refilled - granted, max(stamp, now)


def wait(tokens: float, rate: float) -> float:
    """Seconds until a bucket holding ``tokens`` (< 1) has one whole token again."""
    return max(0.0, (1.0 - tokens) / rate)


def fallback(rate: float, burst: int, nodes: int) -> tuple[float, int]:
    """The local bucket a node uses while the database cannot be reached: its share of the
    claim's rate and burst among ``nodes`` live nodes (at least 1)."""
    n = max(1, nodes)
    return rate / n, max(1, burst // n)


def rate_tolerance(processes: int, rate: float, burst: int) -> int:
    """Requests over ``burst + rate × T`` the fleet may admit in a window: one batch per process."""
    return max(1, processes) * batch(rate, burst)


def connection_tolerance(admitted_elsewhere_in_window: int, limit: int, nodes: int) -> int:
    """The most connections the fleet may hold for a claim: ``limit`` plus those admitted on the
    other nodes within the unseen window (``2 × tick`` + a round trip), capped at ``nodes × limit``."""
    return min(limit + max(0, admitted_elsewhere_in_window), max(1, nodes) * limit)
