"""What this process wrote to a SQLite store, so that its own registry applies one write as one
change instead of re-reading a whole snapshot (issue 19).

SQLite cannot list its changes since a version as PostgreSQL's ``changes_since`` does (no
stamps, no tombstones), and ``PRAGMA data_version`` moves only for other connections' commits.
So the store keeps :class:`LocalChanges`: its own :attr:`version` (what ``data_version()``
answers) moves by one for each of its own write transactions and by one whenever it sees
``PRAGMA data_version`` moved (another process's commit), and a bounded journal says what each
of its own write transactions touched (claim ids, (claim id, name) keys), as the shared queries
declare it (``SQLStore._changed``). :meth:`LocalChanges.since` answers what changed after a
version only when every change since is one of this process's own, declared ones; otherwise
None, and the reader reads a whole snapshot as before: a commit by another process or worker,
a write that declared nothing (key rotation, a migration), or a version older than the journal.

The foreign commit is seen at the latest inside the next own write transaction (``BEGIN
IMMEDIATE`` holds the write lock: no other commit can fall between that look and the commit),
so an own write never hides one. Not thread-safe by itself: the store calls it under its lock.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.store import rows
from proxy.store.base import Changes
from proxy.store.queries import _CLAIM, _CRED

if TYPE_CHECKING:
    from proxy.store.base import Conn

KEEP = 4096  # own write transactions remembered; a reader further behind reads a snapshot


@dataclass(slots=True)
class Touched:
    """What some write transactions changed: claims (written or deleted), claims deleted (their
    credentials with them), credentials (written or deleted)."""

    claims: set[str] = field(default_factory=set)
    deleted_claims: set[str] = field(default_factory=set)
    credentials: set[tuple[str, str]] = field(default_factory=set)

    def update(self, other: Touched) -> None:
        self.claims |= other.claims
        self.deleted_claims |= other.deleted_claims
        self.credentials |= other.credentials


class LocalChanges:
    def __init__(self, keep: int = KEEP) -> None:
        self.version = 0
        self._pragma: int | None = None  # PRAGMA data_version as last seen
        self._foreign_at = 0  # the version at which another connection's commit was last seen
        self._journal: deque[tuple[int, Touched | None]] = deque(maxlen=keep)
        self._pending: Touched | None = None

    def saw(self, pragma: int) -> int:
        """Note ``PRAGMA data_version`` as read now; returns :attr:`version`."""
        if pragma != self._pragma:
            self._pragma = pragma
            self.version += 1
            self._foreign_at = self.version
        return self.version

    def begin(self) -> None:
        """A write transaction of this process starts (nothing declared yet)."""
        self._pending = None

    def touch(self, claim_id: str, name: str | None = None, *, deleted: bool = False) -> None:
        """Declare what the running write transaction changes."""
        if self._pending is None:
            self._pending = Touched()
        if name is not None:
            self._pending.credentials.add((claim_id, name))
        else:
            self._pending.claims.add(claim_id)
            if deleted:
                self._pending.deleted_claims.add(claim_id)

    def committed(self) -> None:
        """The write transaction committed: one version more, journaled with what it declared
        (None when it declared nothing: a reader across it reads a snapshot)."""
        self.version += 1
        self._journal.append((self.version, self._pending))
        self._pending = None

    def since(self, version: int) -> Touched | None:
        """What changed after ``version``, when all of it is this process's declared writes;
        None when a reader at ``version`` must read a whole snapshot."""
        if version < self._foreign_at or version > self.version:
            return None
        if self._journal and self._journal[0][0] > version + 1:
            return None  # older than the journal keeps
        out = Touched()
        for at, touched in self._journal:
            if at <= version:
                continue
            if touched is None:
                return None
            out.update(touched)
        return out


def read(db: Conn, version: int, touched: Touched) -> Changes:
    """The rows ``touched`` names as they are now (inside a read transaction ``db``), as the
    :class:`Changes` that bring a reader to ``version``: a row gone is a removal, a claim deleted
    is removed (and, made again since under its id, added), every OAuth spec (few, small)."""
    claims, removed_claims = [], sorted(touched.deleted_claims)
    for claim_id in sorted(touched.claims):
        if row := db.execute(_CLAIM, (claim_id,)).fetchone():
            claims.append(rows.claim(row))
        elif claim_id not in touched.deleted_claims:
            removed_claims.append(claim_id)
    creds, removed = [], []
    for key in sorted(touched.credentials):
        if row := db.execute(_CRED, key).fetchone():
            creds.append(rows.cred(row))
        else:
            removed.append(key)
    specs = db.execute("SELECT claim_id, name, spec FROM credential_oauth").fetchall()
    oauth = {(c, n): json.loads(v) for c, n, v in specs}
    return Changes(version, claims, creds, removed_claims, removed, oauth)
