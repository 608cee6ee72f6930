"""Fleet-wide connection and rate limits on the PostgreSQL store (issue 14): a
:class:`~proxy.core.limits.Counters` for a node of a fleet. The arithmetic and the tolerances
are :mod:`proxy.core.fleet`; this module is its SQL and its timer.

:class:`FleetCounters` wraps the node's own table (:class:`proxy.store.counters.SharedCounters`),
which still counts every gauge exactly for the node and answers every key that is not a
claim's connections or rate (hook processes stay per node) at the same cost as before.

- **Connections** (``connections\\0CLAIM``): admission is the node's own count against the
  claim's limit less the other nodes' last-known count (:func:`proxy.core.fleet.connection_bound`):
  a dict look-up on the hot path. A daemon thread, every :data:`TICK` seconds, in one transaction
  of a pooled connection: writes this process's heartbeat, publishes this process's count of
  each claim whose count changed (a zero deletes the row), and reads the sum over the other
  nodes' rows whose heartbeat is younger than :data:`HEARTBEAT_BOUND` (a node killed with
  ``kill -9`` has its connections given back after that bound). Each process (every worker) is
  one row set ``(run, worker)``; ``run`` is random per start of the node (shared by its
  workers, :data:`RUN_ENV`), so a restarted node's old rows are another node's until they
  expire, and the rows of this node's other workers are not counted twice. A stopped node
  deletes its rows.
- **Rate** (``rate\\0CLAIM``): the node's bucket first (as before), then the fleet's bucket in
  the database: the process spends tokens leased :func:`proxy.core.fleet.batch` at a time by
  one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` that refills from the database's clock
  (``now()``; PostgreSQL re-evaluates the update on the newest row after a concurrent lease, so
  two leases never spend the same tokens). A refused lease is remembered until its tokens are
  back: a claim hammering past its rate costs no database work per refused request.
- **Database unreachable**: the other nodes' counts are kept as last read (never forgotten
  because the read fails: fail closed); a lease that fails falls back, for :data:`RETRY`
  seconds at a time, to a local bucket of the claim's share among the nodes last seen alive
  (:func:`proxy.core.fleet.fallback`). Until its first read a node knows no other node's count
  and admits against its own (a node that starts without its database refuses store claims
  anyway: ``store_never_synced``); :meth:`FleetCounters.start` reads once before the node serves.

Side tables (created when absent on every open, :data:`proxy.store.pgschema.SIDE_TABLES`):
``fleet_nodes(run, worker, node, heartbeat)``, ``fleet_gauges(run, worker, claim, count)``,
``fleet_buckets(claim, tokens, stamp, granted, full_at)``; ``claim`` is :func:`row_key` (hex).
Rows of nodes silent for :data:`FORGET_AFTER` seconds and buckets full for as long are deleted
by any node's timer.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from proxy.core import fleet
from proxy.store.base import StoreError
from proxy.store.counters import SharedCounters
from proxy.store.postgres import PostgresStore

__all__ = ["HEARTBEAT_BOUND", "RUN_ENV", "TICK", "FleetCounters", "node_run", "row_key"]

TICK = 0.5  # seconds between publishes and reads
HEARTBEAT_BOUND = 5.0  # seconds: an older heartbeat's connections are given back
FORGET_AFTER = 60.0  # seconds: rows of a node silent this long are deleted
RETRY = 1.0  # seconds the fallback bucket serves after a failed lease before the database is asked again
LEASE_WAIT = 0.25  # seconds the hot path waits for a pooled connection to lease tokens
RUN_ENV = "SURROGATE_FLEET_RUN"  # the node's run id, set by the supervisor for its workers
_CONNS, _RATE, _FALLBACK = "connections\0", "rate\0", "fleetfallback\0"
_REPUBLISH_EVERY = 20  # ticks: every count is published again (heals rows lost to a prune)
# whole statements, never built; the clock is the database's (``now()``: one for every node)
_BEAT = """INSERT INTO fleet_nodes (run, worker, node, heartbeat)
    VALUES (%s, %s, %s, CAST(extract(epoch FROM now()) AS double precision))
    ON CONFLICT (run, worker) DO UPDATE SET heartbeat = excluded.heartbeat"""
_PUBLISH = """INSERT INTO fleet_gauges (run, worker, claim, count)
    SELECT %s, %s, c, n FROM unnest(CAST(%s AS text[]), CAST(%s AS integer[])) AS t(c, n)
    ON CONFLICT (run, worker, claim) DO UPDATE SET count = excluded.count"""
_ZEROES = "DELETE FROM fleet_gauges WHERE run = %s AND worker = %s AND count <= 0"
_OTHERS = """SELECT g.claim, sum(g.count) FROM fleet_gauges g
    JOIN fleet_nodes n ON n.run = g.run AND n.worker = g.worker
    WHERE g.run <> %s AND n.heartbeat > CAST(extract(epoch FROM now()) AS double precision) - %s
    GROUP BY g.claim"""
_ALIVE = """SELECT count(DISTINCT run) FROM fleet_nodes
    WHERE heartbeat > CAST(extract(epoch FROM now()) AS double precision) - %s"""
_PRUNE = (
    "DELETE FROM fleet_nodes WHERE heartbeat < CAST(extract(epoch FROM now()) AS double precision) - %s",
    "DELETE FROM fleet_buckets WHERE full_at < CAST(extract(epoch FROM now()) AS double precision) - %s",
)
_GONE = "DELETE FROM fleet_nodes WHERE run = %s AND worker = %s"
# proxy.core.fleet.lease in SQL. The inserted row is a new bucket (full: burst, less what it
# grants at once); on a conflict, excluded.stamp is the clock, and the refilled count
#   R = LEAST(burst, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * rate)
# is spelled out where it is used (SET reads the old row only). PostgreSQL evaluates the update
# on the newest row version after a concurrent lease committed: two leases never share tokens.
_LEASE = """INSERT INTO fleet_buckets AS b (claim, tokens, stamp, granted, full_at)
    SELECT %(claim)s, %(burst)s - LEAST(%(want)s, %(burst)s), t, LEAST(%(want)s, %(burst)s),
           t + LEAST(%(want)s, %(burst)s) / %(rate)s
    FROM (SELECT CAST(extract(epoch FROM now()) AS double precision) AS t) AS clock
    ON CONFLICT (claim) DO UPDATE SET
      granted = LEAST(%(want)s,
        floor(LEAST(%(burst)s, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * %(rate)s))),
      tokens = LEAST(%(burst)s, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * %(rate)s)
        - LEAST(%(want)s,
            floor(LEAST(%(burst)s, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * %(rate)s))),
      stamp = GREATEST(b.stamp, excluded.stamp),
      full_at = GREATEST(b.stamp, excluded.stamp) + (%(burst)s
        - LEAST(%(burst)s, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * %(rate)s)
        + LEAST(%(want)s,
            floor(LEAST(%(burst)s, b.tokens + GREATEST(0, excluded.stamp - b.stamp) * %(rate)s))))
        / %(rate)s
    RETURNING granted, tokens"""

log = logging.getLogger(__name__)


def row_key(claim: str) -> str:
    """A claim id as the fleet tables hold it: the hex of its UTF-8. A rules file's claim id is
    any string, and PostgreSQL's text takes no NUL nor a lone surrogate: one such claim must not
    fail every node's tick (whose transaction publishes every claim)."""
    return claim.encode("utf-8", "surrogatepass").hex()


def node_run() -> str:
    """This node's run id: the supervisor's (:data:`RUN_ENV`), else a new one, put there for
    the workers it starts."""
    run = os.environ.get(RUN_ENV)
    if not run:
        run = os.environ[RUN_ENV] = secrets.token_hex(12)
    return run


class FleetCounters:
    """:class:`~proxy.core.limits.Counters` over ``local`` (the node's table) and the fleet's
    rows in ``store`` (module docstring). ``run`` and ``worker`` name this process's rows,
    ``node`` is shown in them. Thread-safe where it must be: the hot path is the event loop's,
    the timer its own thread."""

    def __init__(self, local: SharedCounters, store: PostgresStore, run: str, worker: int, node: str,
                 *, tick: float = TICK, bound: float = HEARTBEAT_BOUND) -> None:  # fmt: skip
        self.local, self.store, self.run, self.worker, self.node = local, store, run, worker, node
        self.tick, self.bound = tick, bound
        self._lock = threading.Lock()
        # every claim below is its row_key
        self._mine: dict[str, int] = {}  # claim → this process's open connections (its column)
        self._dirty: set[str] = set()  # claims whose count is not yet published
        self._all = True  # publish every count at the next tick (the first, and after a failure)
        self.others: dict[str, int] = {}  # claim → the other nodes' count, as last read
        self.alive = 1  # nodes seen alive at the last read (this one included)
        self.read_at: float | None = None  # time.monotonic() of the last read
        self._tokens: dict[str, int] = {}  # claim → tokens leased and not yet spent
        self._empty_until: dict[str, float] = {}  # claim → when the fleet's bucket has a token again
        self._lease_retry_at = float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="surrogate-fleet-limits", daemon=True)
        self._ticks = 0

    def start(self) -> FleetCounters:
        """One tick now (a node restarted under load knows the others' counts before it serves
        a connection, when the store answers), then the timer."""
        try:
            self.sync()
        except StoreError as e:
            log.warning("fleet limits: cannot reach the store at start (%s)", e)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the timer and delete this process's rows (best effort: else they expire)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.tick + 5)
        try:
            with self.store._connection(LEASE_WAIT) as conn:
                conn.execute(_GONE.encode(), (self.run, self.worker))
        except StoreError:
            pass

    # --- Counters -------------------------------------------------------------------------------

    def acquire(self, wants: Sequence[tuple[str, int]]) -> int:
        others = self.others
        bounded = [
            (k, fleet.connection_bound(b, others.get(row_key(k[len(_CONNS) :]), 0)))
            if k.startswith(_CONNS)
            else (k, b)
            for k, b in wants
        ]
        full = self.local.acquire(bounded)
        if full == -1:
            self._count([k for k, _ in wants], 1)
        return full

    def release(self, keys: Sequence[str]) -> None:
        self.local.release(keys)
        self._count(keys, -1)

    def count(self, key: str) -> int:
        return self.local.count(key)

    def release_worker(self, index: int) -> None:
        self.local.release_worker(index)
        if index == self.worker:
            with self._lock:
                self._dirty.update(self._mine)
                self._mine = {c: 0 for c in self._mine}

    def take(self, key: str, rate: float, burst: int, now: float) -> float:
        wait = self.local.take(key, rate, burst, now)
        if wait or not key.startswith(_RATE):
            return wait
        claim = row_key(key[len(_RATE) :])
        held = self._tokens.get(claim, 0)
        if held >= 1:
            self._tokens[claim] = held - 1
            return 0.0
        moment = time.monotonic()
        if moment < self._empty_until.get(claim, float("-inf")):
            return self._empty_until[claim] - moment
        if moment < self._lease_retry_at:
            return self._fallback(claim, rate, burst, now)
        try:
            granted, left = self._lease(claim, rate, burst, fleet.batch(rate, burst))
        except StoreError as e:
            log.warning("fleet rate lease failed (%s): the node's share of the rate serves", e)
            self._lease_retry_at = moment + RETRY
            return self._fallback(claim, rate, burst, now)
        if granted >= 1:
            self._empty_until.pop(claim, None)
            self._tokens[claim] = granted - 1
            return 0.0
        wait = fleet.wait(left, rate)
        self._empty_until[claim] = moment + wait
        return wait

    # --- the database ---------------------------------------------------------------------------

    def _fallback(self, claim: str, rate: float, burst: int, now: float) -> float:
        share, cap = fleet.fallback(rate, burst, self.alive)
        return self.local.take(_FALLBACK + claim, share, cap, now)

    def _lease(self, claim: str, rate: float, burst: int, want: int) -> tuple[int, float]:
        args: dict[str, Any] = {"claim": claim, "rate": float(rate), "burst": float(burst),
                                "want": float(want)}  # fmt: skip
        with self.store._connection(LEASE_WAIT) as conn:
            row = conn.execute(_LEASE.encode(), args).fetchone()
        assert row is not None  # an upsert ... RETURNING always returns its row
        return int(row[0]), float(row[1])

    def _count(self, keys: Sequence[str], step: int) -> None:
        with self._lock:
            for key in keys:
                if key.startswith(_CONNS):
                    claim = row_key(key[len(_CONNS) :])
                    self._mine[claim] = max(0, self._mine.get(claim, 0) + step)
                    self._dirty.add(claim)

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self.tick):
            try:
                self.sync()
                if failing:
                    log.warning("fleet limits: the store answers again")
                failing = False
            except StoreError as e:
                if not failing:
                    log.warning("fleet limits: cannot reach the store (%s); other nodes' counts kept", e)
                failing = True
            except Exception as e:  # the timer must outlive any one bad tick
                log.error("fleet limits tick failed with %s", type(e).__name__)

    def sync(self) -> None:
        """One tick: heartbeat, publish the changed counts, read the others' (module docstring).
        Raises StoreError (the counts stay to publish, the others' stay as last read)."""
        self._ticks += 1
        with self._lock:
            everything = self._all or self._ticks % _REPUBLISH_EVERY == 0
            claims = sorted(self._mine if everything else self._dirty)
            counts = [self._mine.get(c, 0) for c in claims]
            self._dirty, self._all = set(), False
        started = time.monotonic()
        try:
            with self.store._connection(self.tick) as conn, conn.transaction():
                conn.execute(_BEAT.encode(), (self.run, self.worker, self.node))
                if claims:
                    conn.execute(_PUBLISH.encode(), (self.run, self.worker, claims, counts))
                    conn.execute(_ZEROES.encode(), (self.run, self.worker))
                rows = conn.execute(_OTHERS.encode(), (self.run, self.bound)).fetchall()
                alive = conn.execute(_ALIVE.encode(), (self.bound,)).fetchone()
                if self._ticks % _REPUBLISH_EVERY == 1:
                    for statement in _PRUNE:
                        conn.execute(statement.encode(), (FORGET_AFTER,))
        except BaseException:
            with self._lock:  # a failed transaction published nothing: all of it again next time
                self._dirty.update(claims)
                self._all = True
            raise
        with self._lock:  # a published zero is forgotten unless it changed since
            self._mine = {c: n for c, n in self._mine.items() if n > 0 or c in self._dirty}
        self.others = {str(c): int(n) for c, n in rows}
        self.alive = max(1, int(alive[0]) if alive else 1)
        self.read_at = started
