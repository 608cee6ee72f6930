"""This node's copy of the store's claims, kept by applying what changed (issue 14).

:class:`Mirror` holds the store's rows as last read (claims, credentials, OAuth specs), the
core :class:`Credential` built of each credential row, one :class:`ClaimIndex` per claim, and the
:class:`Claim` taken of it: what :class:`proxy.store.registry.Registry` serves. :meth:`Mirror.apply`
puts a :class:`Changes` in force, and does the work of what changed only: a credential row whose
shape (every field but its use counters) or OAuth spec moved is built again and put into its
claim's index, whose Claim is then taken with C-level copies (a tuple of a list, a dict copy),
so a write to one of a claim's 10,000 credentials builds one Credential, not 10,000 (measured by
``bench/fleet.py``). Claim-level changes cost more, as they may: a claim deleted, or deleted and
created again under its id, empties its index; a token rotation or a new pool rebuilds only the
Claim. A whole snapshot (SQLite after another process's commit, or a reader behind PostgreSQL's
pruned tombstones) is
first compared with the rows held (:meth:`Mirror.diff`) and then applied the same way: a pass of
C-level comparisons, and claims whose rows did not change keep their Claim object (and with it
the scrubber's compiled patterns, :mod:`addons.scrubpairs`).

Every row is built before anything held is changed, so a row that does not build (a value the
core refuses) raises with the copy as it was, and the next refresh reads the same changes again.
Claims are frozen snapshots: a flow (or a streaming body's scrubber) holding an older Claim keeps
exactly it; the next request reads the new one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import operator
from collections.abc import Callable
from typing import Any

from proxy.core.claimindex import ClaimIndex
from proxy.core.policy import Claim, Credential, Network, TokenCheck
from proxy.store.base import Changes, ClaimRecord, CredentialRecord

type Key = tuple[str, str]  # (claim id, credential name)
type Spec = dict[str, Any]
# builds the core's credential for a row and its OAuth spec (the registry's, reusing what it can)
type Build = Callable[[CredentialRecord, Spec | None], Credential]
# the proxy token check of a claim: (claim id, the Claim of the same generation held, if any)
type Token = Callable[[str, Claim | None], TokenCheck]

_SHAPE = operator.attrgetter(
    *(f.name for f in dataclasses.fields(CredentialRecord) if f.name not in ("last_used_at", "requests_used"))
)


def shape(r: CredentialRecord) -> tuple[Any, ...]:
    """A row as far as the credential built from it goes: without the counters that move on use
    (a tuple of its other fields, one C-level call; ``dataclasses.replace`` cost ~18 µs a row)."""
    fields: tuple[Any, ...] = _SHAPE(r)
    return fields


def networks(sources: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(s, strict=False) for s in sources)


class Mirror:
    def __init__(self) -> None:
        self.records: dict[str, ClaimRecord] = {}
        self.rows: dict[str, dict[str, CredentialRecord]] = {}  # per claim, by credential name
        self.specs: dict[Key, Spec] = {}
        # per credential: the shape of the row it was built from, and the credential; a row
        # deleted and created again under its name (version 1 both times) has another shape
        self.built: dict[Key, tuple[tuple[Any, ...], Credential]] = {}
        self.indexes: dict[str, ClaimIndex] = {}
        self.claims: dict[str, Claim] = {}
        # per claim: (version, created_at), so that a claim deleted and created again under the
        # same id (version 1 both times) is another claim
        self.versions: dict[str, tuple[int, float]] = {}

    def holds(self, r: CredentialRecord) -> bool:
        """True when the credential held under ``r``'s name was built from a row of its shape."""
        known = self.built.get((r.claim_id, r.name))
        return known is not None and known[0] == shape(r)

    def diff(self, whole: Changes) -> Changes:
        """A whole snapshot as the changes from what is held: the rows that differ (but for their
        use counters), the claims and credentials no longer there; a claim created again under
        its id (another ``created_at``) removed and added, as ``changes_since`` says it."""
        ids = {c.id for c in whole.claims}
        have = {(r.claim_id, r.name) for r in whole.credentials}
        again = {c.id for c in whole.claims if (k := self.records.get(c.id)) and k.created_at != c.created_at}
        return Changes(
            whole.version,
            whole.claims,
            [r for r in whole.credentials if r.claim_id in again or not self.holds(r)],
            [cid for cid in self.records if cid not in ids or cid in again],
            [(cid, n) for cid, byname in self.rows.items() for n in byname if (cid, n) not in have],
            whole.oauth,
        )

    def apply(self, changes: Changes, build: Build, token: Token) -> tuple[set[str], bool]:
        """Put ``changes`` in force. Returns the ids of claims deleted or changed (another
        generation, or a credential removed: their tunnels close) and whether a claim with
        source addresses changed (transparent mode's index must be rebuilt)."""
        dropped = set(changes.removed_claims)
        claim_rows: dict[str, ClaimRecord | None] = dict.fromkeys(dropped)
        claim_rows.update((c.id, c) for c in changes.claims if c.id in dropped or self.records.get(c.id) != c)
        rows: dict[Key, CredentialRecord | None] = {}
        for cid in dropped:
            rows.update(((cid, n), None) for n in self.rows.get(cid, {}))
        rows.update((k, None) for k in changes.removed_credentials)
        rows.update(((r.claim_id, r.name), r) for r in changes.credentials)
        for k in changes.oauth.keys() | self.specs.keys():  # a spec set, changed or cleared
            held_row = self.rows.get(k[0], {}).get(k[1])
            if changes.oauth.get(k) != self.specs.get(k) and k not in rows and held_row is not None:
                rows[k] = held_row
        built = {k: (shape(r), build(r, changes.oauth.get(k))) for k, r in rows.items() if r is not None}
        nets = {cid: networks(c.sources) for cid, c in claim_rows.items() if c is not None}
        # nothing below raises: what is held changes whole
        touched = set(claim_rows)
        gone = {cid for cid, _ in changes.removed_credentials if cid in self.versions}
        for cid in dropped:
            self.indexes.pop(cid, None)
        for (cid, name), r in rows.items():
            known = self.built.pop((cid, name), None)
            if r is None:
                if self.rows.get(cid, {}).pop(name, None) is not None:
                    touched.add(cid)
                    gone.add(cid)  # a credential removed: a stream that carried it ends
                if (index := self.indexes.get(cid)) is not None:
                    index.remove(name)
                continue
            self.rows.setdefault(cid, {})[name] = r
            self.built[cid, name] = now_built = built[cid, name]
            if known is None or known[1] is not now_built[1] or cid in dropped:
                self.indexes.setdefault(cid, ClaimIndex()).put(now_built[1])
                touched.add(cid)
        for cid, c in claim_rows.items():
            if c is None:
                self.records.pop(cid, None)
            else:
                self.records[cid] = c
        sourced = False
        for cid in touched:
            held, generation = self.claims.get(cid), self.versions.get(cid)
            sourced = sourced or bool(held and held.sources)
            record = self.records.get(cid)
            if record is None:
                gone |= {cid} if generation is not None else set()
                self._forget(cid)
                continue
            now = (record.version, record.created_at)
            same = held if generation == now else None
            sources = nets[cid] if cid in nets else held.sources if held else networks(record.sources)
            claim = self.indexes.setdefault(cid, ClaimIndex()).claim
            self.claims[cid] = claim(cid, record.pool, token(cid, same), "store", sources, record.interface)
            self.versions[cid] = now
            sourced = sourced or bool(sources)
            if generation is not None and generation != now:
                gone.add(cid)
        self.specs = dict(changes.oauth)
        return gone, sourced

    def _forget(self, cid: str) -> None:
        for name in self.rows.pop(cid, {}):
            self.built.pop((cid, name), None)
        self.claims.pop(cid, None)
        self.versions.pop(cid, None)
        self.indexes.pop(cid, None)
