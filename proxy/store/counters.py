"""Node-wide counters: what every worker of one node counts together (issue 20, items 6 and 11).

``surrogate run --workers N`` runs N processes; a limit kept in each one's memory lets a claim
have N times its share. The limits that must hold for the whole node live here instead:

- **gauges** with a bound: a claim's open client connections, the hook commands running for a
  pool and for the node. :meth:`Counters.acquire` takes one unit of several gauges at once, or
  none when one is at its bound; :meth:`Counters.release` gives them back.
- **token buckets**: a claim's request rate (:meth:`Counters.take`), refilled from the
  system-wide monotonic clock, so one bucket serves every worker.

The table is a file, ``<state dir>/limits.shm``, mapped into every worker (``mmap``); one
``flock`` on it serialises every read-modify-write (a few µs: measured in
tests/unit/store/test_counters.py, ``test_a_shared_check_costs_microseconds``). It is created fresh,
empty, by the process that starts the node (the supervisor, or the single process of
``--workers 1``): no count outlives a restart of the node. ``flock`` is released by the kernel
when a process dies, so a killed worker never leaves the lock held.

Each gauge is counted per worker (one column per worker index), and a gauge's value is the sum
of the columns. A worker's column is zeroed by :meth:`Counters.release_worker` when the
supervisor sees that worker exit and when a worker starts: the connections and hook processes of
a worker killed with ``kill -9`` are given back, never leaked. (Today a dead worker stops the
whole node, and the next start begins with an empty table anyway.)

The table has :data:`SLOTS` slots, addressed by a 128-bit BLAKE2b digest of the key (open
addressing, linear probing within :data:`PROBE` slots). A slot whose gauges are all zero and
whose bucket is full again holds nothing worth keeping and is reused; a key that finds no free
or reusable slot raises :class:`CountersFull` (the caller refuses: fail closed).

A fleet backend (one table for many nodes) can implement the same :class:`Counters` protocol.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from proxy.core.errors import SurrogateError
from proxy.core.limits import Counters

__all__ = ["Counters", "CountersFull", "SharedCounters"]

FILENAME = "limits.shm"
SLOTS = 65536
PROBE = 64
_MAGIC = b"SURRLIM1"
_HEADER = struct.Struct("=8sII")  # magic, workers, slots
_HEADER_SIZE = 64
_BUCKET = struct.Struct("=dddq")  # tokens, stamp, full_at, used (0: the bucket was never taken from)
_KEY = 16
_EMPTY = bytes(_KEY)


class CountersFull(SurrogateError):
    """No slot is free for a new key: every slot in its probe window is in use right now."""


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=_KEY).digest()


class SharedCounters:
    """:class:`Counters` over a table mapped from a file (or anonymous memory, for one process).

    ``worker`` is this process's column (0 ≤ worker < the table's workers).
    """

    def __init__(self, buf: mmap.mmap, fd: int | None, worker: int) -> None:
        magic, workers, slots = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC or not 0 <= worker < workers:
            raise ValueError(f"not a limits table for worker {worker}")
        self._buf, self._fd, self.worker, self.workers, self.slots = buf, fd, worker, workers, slots
        self._counts = struct.Struct(f"={workers}i")
        self._slot = _KEY + _BUCKET.size + self._counts.size
        self._mine = struct.Struct("=i")

    # --- construction ---------------------------------------------------------------------------

    @staticmethod
    def _size(workers: int, slots: int) -> int:
        return _HEADER_SIZE + slots * (_KEY + _BUCKET.size + 4 * workers)

    @classmethod
    def create(cls, path: Path, workers: int, slots: int = SLOTS) -> None:
        """Write a fresh, empty table for ``workers`` workers at ``path`` (mode 0600). A table
        already there is replaced by a new file: a process still holding the old one keeps its
        own copy and never counts into the new node's."""
        tmp = path.with_name(path.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, cls._size(workers, slots))  # sparse: zero pages cost nothing
            os.pwrite(fd, _HEADER.pack(_MAGIC, workers, slots), 0)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    @classmethod
    def open(cls, path: Path, worker: int) -> SharedCounters:
        """Map the table at ``path`` as worker ``worker``; raises OSError or ValueError."""
        fd = os.open(path, os.O_RDWR)
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
            return cls(buf, fd, worker)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def anonymous(cls, workers: int = 1, slots: int = 4096, worker: int = 0) -> SharedCounters:
        """A table in this process's memory only (tests, and a proxy with no state dir)."""
        buf = mmap.mmap(-1, cls._size(workers, slots))
        _HEADER.pack_into(buf, 0, _MAGIC, workers, slots)
        return cls(buf, None, worker)

    def view(self, worker: int) -> SharedCounters:
        """The same table as another worker sees it (tests: two workers in one process)."""
        return SharedCounters(self._buf, self._fd, worker)

    def close(self) -> None:
        self._buf.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # --- the table ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _at(self, i: int) -> int:
        return _HEADER_SIZE + i * self._slot

    def _reusable(self, at: int, now: float) -> bool:
        if any(self._counts.unpack_from(self._buf, at + _KEY + _BUCKET.size)):
            return False
        _, _, full_at, used = _BUCKET.unpack_from(self._buf, at + _KEY)
        return bool(not used or now >= full_at)

    def _find(self, key: str, now: float | None, create: bool, keep: Sequence[int] = ()) -> int | None:
        """The offset of ``key``'s slot; with ``create``, a new one (zeroed) when absent, never
        one of the offsets in ``keep`` (slots just made for the other keys of one acquire)."""
        digest = _digest(key)
        home = int.from_bytes(digest[:8], "little") % self.slots
        spare = None
        for step in range(PROBE):
            at = self._at((home + step) % self.slots)
            found = self._buf[at : at + _KEY]
            if found == digest:
                return at
            if found == _EMPTY:  # slots are never emptied, so the key is not further on
                spare = at if spare is None else spare
                break
            if create and spare is None and at not in keep and self._reusable(at, now or 0.0):
                spare = at
        if not create:
            return None
        if spare is None:
            raise CountersFull(f"the node's limits table has no free slot for a new key ({self.slots} slots)")
        self._buf[spare : spare + self._slot] = digest + bytes(self._slot - _KEY)
        return spare

    def _mine_at(self, at: int) -> int:
        return at + _KEY + _BUCKET.size + 4 * self.worker

    def acquire(self, wants: Sequence[tuple[str, int]]) -> int:
        now = time.monotonic()
        with self._locked():
            slots: list[int] = []
            for key, _ in wants:
                found = self._find(key, now, create=True, keep=slots)
                assert found is not None
                slots.append(found)
            for i, ((_, bound), at) in enumerate(zip(wants, slots, strict=True)):
                if sum(self._counts.unpack_from(self._buf, at + _KEY + _BUCKET.size)) >= bound:
                    return i
            for at in slots:
                (mine,) = self._mine.unpack_from(self._buf, self._mine_at(at))
                self._mine.pack_into(self._buf, self._mine_at(at), mine + 1)
        return -1

    def release(self, keys: Sequence[str]) -> None:
        with self._locked():
            for key in keys:
                at = self._find(key, None, create=False)
                if at is not None:
                    (mine,) = self._mine.unpack_from(self._buf, self._mine_at(at))
                    self._mine.pack_into(self._buf, self._mine_at(at), max(0, mine - 1))

    def take(self, key: str, rate: float, burst: int, now: float) -> float:
        with self._locked():
            at = self._find(key, now, create=True)
            assert at is not None
            tokens, stamp, _, used = _BUCKET.unpack_from(self._buf, at + _KEY)
            if not used:
                tokens, stamp = float(burst), now
            tokens = min(float(burst), tokens + max(0.0, now - stamp) * rate)  # a lower burst caps
            stamp = max(stamp, now)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate
            _BUCKET.pack_into(self._buf, at + _KEY, tokens, stamp, stamp + (burst - tokens) / rate, 1)
        return wait

    def count(self, key: str) -> int:
        with self._locked():
            at = self._find(key, None, create=False)
            return 0 if at is None else sum(self._counts.unpack_from(self._buf, at + _KEY + _BUCKET.size))

    def release_worker(self, index: int) -> None:
        if not 0 <= index < self.workers:
            return
        with self._locked():
            for i in range(self.slots):
                at = self._at(i)
                if self._buf[at : at + _KEY] != _EMPTY:
                    self._mine.pack_into(self._buf, at + _KEY + _BUCKET.size + 4 * index, 0)
