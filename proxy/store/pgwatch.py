"""Change propagation for the PostgreSQL store: a node learns of another node's write from a
``NOTIFY`` and, should a notification be lost, from a poll of the version row.

Every write transaction of :class:`proxy.store.postgres.PostgresStore` ends with
``pg_notify('surrogate_store', <new data_version>)``, delivered by PostgreSQL to every listener
when (and only when) it commits. :class:`Watcher` holds one connection of its own (outside the
pool) in a daemon thread: ``LISTEN surrogate_store``, then it waits for a notification at most
``poll`` seconds and, after each notification or timeout, reads the version row. Each read
*confirms* the cache (the version and when it was read); a lost notification therefore costs at
most one poll, and a dropped connection is reopened (every ``poll`` seconds while it fails).

:meth:`Watcher.current` is the cached version while it was confirmed within ``2 × poll``
seconds, else None: the caller then reads the database itself, so a stuck or dead watcher never
leaves a node on an old version for longer than that, and a node that cannot reach the database
gets the database's error (StoreError) rather than a stale answer.

Bound, as measured by ``tests/unit/store/test_postgres.py`` on this machine (printed there): a
write on one node is seen by another node's :meth:`Watcher.current` within a few milliseconds
(p99), and within ``poll`` + one round trip when the notification is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

CHANNEL = "surrogate_store"
log = logging.getLogger(__name__)

type Connect = Callable[[], psycopg.Connection[tuple[Any, ...]]]


class Watcher:
    """The node's view of the store-wide version, kept current by LISTEN/NOTIFY and a poll."""

    def __init__(self, connect: Connect, poll: float) -> None:
        self._connect = connect
        self.poll = poll
        self._lock = threading.Lock()
        self._version: int | None = None
        self._confirmed = float("-inf")  # time.monotonic() of the last read of the version row
        self.notified = 0  # notifications received (for tests and metrics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="surrogate-store-watch", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll + 5)

    def current(self) -> int | None:
        """The version, if confirmed within 2 × poll seconds; None: read the database."""
        confirmed = self.confirmed()
        return None if confirmed is None else confirmed[0]

    def confirmed(self) -> tuple[int, float] | None:
        """The version and the ``time.monotonic()`` of its last confirmation by a read, if that
        was within 2 × poll seconds; None: read the database. A version this node wrote itself
        (:meth:`saw`) is returned, known current as of the last confirmation."""
        with self._lock:
            if self._version is not None and time.monotonic() - self._confirmed <= 2 * self.poll:
                return self._version, self._confirmed
        return None

    def saw(self, version: int) -> None:
        """A version this node wrote or read itself: the cache moves up to it at once."""
        with self._lock:
            if self._version is None or version > self._version:
                self._version = version

    def _confirm(self, version: int, started: float) -> None:
        """The version row as just read, by a read that began at ``started``: authoritative (a
        database restored from a backup may hold an older version; the node must follow it, not
        wait for it to catch up). Known current as of the read's start, not of the answer's
        arrival: an answer delayed on the way describes the database as it was when the query
        ran (review r-approve: counting from the arrival let a node serve past its bound)."""
        with self._lock:
            self._version, self._confirmed = version, max(self._confirmed, started)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}".encode())
                    while not self._stop.is_set():
                        self._read(conn)
                        for _ in conn.notifies(timeout=self.poll, stop_after=1):
                            self.notified += 1
            except psycopg.Error as e:
                log.warning("store change watch lost its connection: %s", str(e).splitlines()[0:1])
                self._stop.wait(self.poll)

    def _read(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        started = time.monotonic()
        row = conn.execute(b"SELECT data_version FROM surrogate_state").fetchone()
        if row is not None:
            self._confirm(int(row[0]), started)
