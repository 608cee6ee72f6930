"""Per-claim limits: concurrent client connections, request rate, and request-head deadlines.

Pure bookkeeping over plain values; the clock is passed in (seconds, any monotonic origin), so
every rule here is tested with tables. The glue is ``addons/limits.py``.

- **Connections**: a client connection counts toward the claim it was first identified as (its
  CONNECT, or its first request in transparent mode or plain HTTP) until it closes. A connection
  over the pool's ``connections`` is refused before anything is connected upstream.
- **Request rate**: a token bucket per claim (``requests_per_second`` refill, ``burst`` capacity).
  Every CONNECT and every request takes one token; with none left the request is answered 429
  with ``Retry-After`` (RFC 9110 §10.2.3; RFC 6585 §4), the whole seconds until a token is back.
- **Head deadline**: a client connection that is waiting for a request head (just opened, after
  a CONNECT, or between keep-alive requests) must complete one within the header timeout, or it
  is closed: a slowloris client dribbling a head, and a connection that is opened and never
  used, both are. A connection with a request in flight (a slow SSE response, a long upload) is
  never on this clock; mitmproxy's own idle timeout (``tcp_timeout``) bounds silence there.

Connection counts and buckets are the node's (every worker's), kept in :mod:`proxy.store.counters`;
the tolerance of the rate limit is none beyond float rounding: over any T seconds at most
``burst + rate × T`` of a claim's CONNECTs and requests are admitted on the node. With the
PostgreSQL store both also hold for the fleet, within the tolerances of :mod:`proxy.core.fleet`.

Defaults never bother a normal agent (a busy agent makes a few requests per second over a few
connections) and stop one claim from taking the proxy for itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_CONNECTIONS = 256
DEFAULT_RATE = 100.0
DEFAULT_BURST = 200
DEFAULT_HOOK_PROCESSES = 8  # per pool: its hook commands running at once, all its claims together
DEFAULT_APPROVALS = 128  # per claim: its requests held for an operator at once (addons/approve.py)
DEFAULT_NODE_HOOK_PROCESSES = 32  # per node: ``surrogate run --hook-processes``
# The largest WebSocket message (bytes, decompressed) the proxy assembles (addons/wslimit.py):
# mitmproxy holds a whole message before any hook sees it, so past this the connection is closed
# with 1009 (RFC 6455 §7.4.1). 16 MiB: above what chat and realtime APIs send in one message.
DEFAULT_WEBSOCKET_MESSAGE = 16 * 1024 * 1024
DEFAULT_WEBSOCKET_HELD = 256 * 1024 * 1024  # per process: all WebSockets' unfinished messages together
MIN_WEBSOCKET_MESSAGE = 1024
MAX_WEBSOCKET_MESSAGE = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """A pool's limits. ``connections``: open client connections per claim (≥ 1);
    ``rate``: sustained requests per second per claim (> 0); ``burst``: requests allowed at once
    after a quiet spell (≥ 1); ``hook_processes``: hook commands of the pool running at once on
    the node, every claim of the pool together (≥ 1); ``websocket_message``: the largest
    WebSocket message in bytes, either direction (1 KiB to 1 GiB); ``approvals``: requests of a
    claim held for an operator's decision at once, counted in the store (every node; ≥ 1)."""

    connections: int = DEFAULT_CONNECTIONS
    rate: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST
    hook_processes: int = DEFAULT_HOOK_PROCESSES
    websocket_message: int = DEFAULT_WEBSOCKET_MESSAGE
    approvals: int = DEFAULT_APPROVALS


@dataclass(slots=True)
class TokenBucket:
    """``tokens`` fill at ``rate`` per second up to ``burst``; ``now`` is when they were counted."""

    rate: float
    burst: int
    tokens: float
    now: float

    def take(self, now: float) -> float:
        """Take one token at time ``now``. Returns 0.0 when taken, else the seconds until one is
        available (nothing is taken then)."""
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.now) * self.rate)
        self.now = max(self.now, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        return self.tokens + max(0.0, now - self.now) * self.rate >= self.burst


def retry_after(wait: float) -> int:
    """The ``Retry-After`` value (whole seconds, at least 1) for a wait of ``wait`` seconds."""
    return max(1, math.ceil(wait))


def _conn_key(claim: str) -> str:
    return f"connections\0{claim}"


def _rate_key(claim: str) -> str:
    return f"rate\0{claim}"


class Counters(Protocol):
    """What the limits need of the node's shared counters (:mod:`proxy.store.counters` implements
    them for the node; a fleet backend can too)."""

    def acquire(self, wants: Sequence[tuple[str, int]]) -> int:
        """Take one unit of each ``(key, bound)`` gauge, all or none. Returns -1 when taken,
        else the index in ``wants`` of the first gauge already at its bound (nothing taken)."""
        ...

    def release(self, keys: Sequence[str]) -> None:
        """Give back one unit of each gauge this worker took (never below zero)."""
        ...

    def take(self, key: str, rate: float, burst: int, now: float) -> float:
        """One token from bucket ``key`` (``rate`` per second, at most ``burst``) at monotonic
        time ``now``: 0.0 when taken, else the seconds until one is back (nothing taken)."""
        ...

    def count(self, key: str) -> int:
        """The gauge's value now, summed over every worker."""
        ...

    def release_worker(self, index: int) -> None:
        """Zero worker ``index``'s column of every gauge (it died, or starts afresh)."""
        ...


@dataclass(slots=True)
class ClaimLimiter:
    """Connection counts and rate buckets for every claim, kept in the node's shared
    :class:`~proxy.store.counters.Counters` so they hold across workers.

    Connections are keyed by an opaque client-connection id chosen by the caller; which claims a
    connection counts for is this worker's own knowledge (``owner``).
    """

    counters: Counters  # the node's table (proxy.store.counters.SharedCounters), or a test's
    owner: dict[str, set[str]] = field(default_factory=dict)  # connection id → claim ids it counts for

    def open(self, conn: str, claim: str, limits: Limits) -> bool:
        """Count connection ``conn`` toward ``claim``. True when it fits (or already counted),
        False when the claim already holds ``limits.connections`` on the node (nothing is counted
        then). Raises :class:`~proxy.store.counters.CountersFull`."""
        held = self.owner.get(conn)
        if held is not None and claim in held:
            return True
        if self.counters.acquire([(_conn_key(claim), limits.connections)]) != -1:
            return False
        self.owner.setdefault(conn, set()).add(claim)
        return True

    def connections(self, claim: str) -> int:
        """The claim's open connections on the node."""
        return self.counters.count(_conn_key(claim))

    def close(self, conn: str) -> None:
        """Connection ``conn`` closed: its slots are free again (unknown ids are ignored)."""
        claims = self.owner.pop(conn, ())
        if claims:
            self.counters.release([_conn_key(c) for c in claims])

    def take(self, claim: str, limits: Limits, now: float) -> float:
        """One request by ``claim`` at monotonic time ``now``: 0.0 when allowed, else the seconds
        to wait. A reload's new rate and burst apply from the next request (a lower burst caps the
        tokens saved). Raises :class:`~proxy.store.counters.CountersFull`."""
        return self.counters.take(_rate_key(claim), limits.rate, limits.burst, now)


@dataclass(slots=True)
class HeadDeadlines:
    """Which client connections are waiting for a request head, and since when.

    ``waiting`` maps connection id → the time it started waiting; ``busy`` counts requests in
    flight per connection (HTTP/2 carries several); ``done`` holds connections that will never
    carry another head (an opaque tunnel, a WebSocket).
    """

    waiting: dict[str, float] = field(default_factory=dict)
    busy: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def wait(self, conn: str, now: float) -> None:
        """``conn`` opened, or its CONNECT was answered: a head is due."""
        if conn not in self.done and not self.busy.get(conn):
            self.waiting[conn] = now

    def head(self, conn: str) -> None:
        """A complete request head arrived on ``conn``."""
        self.waiting.pop(conn, None)
        self.busy[conn] = self.busy.get(conn, 0) + 1

    def finished(self, conn: str, now: float) -> None:
        """A request on ``conn`` ended (answered, refused or failed)."""
        left = self.busy.get(conn, 0) - 1
        if left > 0:
            self.busy[conn] = left
            return
        self.busy.pop(conn, None)
        self.wait(conn, now)

    def exempt(self, conn: str) -> None:
        """``conn`` became a byte stream (opaque tunnel, WebSocket): no more heads to wait for."""
        self.done.add(conn)
        self.waiting.pop(conn, None)

    def close(self, conn: str) -> None:
        self.waiting.pop(conn, None)
        self.busy.pop(conn, None)
        self.done.discard(conn)

    def overdue(self, now: float, timeout: float) -> list[str]:
        """Connections that have waited for a head longer than ``timeout`` seconds."""
        return [c for c, since in self.waiting.items() if now - since > timeout]
