"""The (secret, placeholder) pairs the scrubbers of :mod:`addons.scrub` and :mod:`addons.wsscrub`
use: every live value of a claim's credentials (current and recently replaced,
:mod:`proxy.store.live`), kept compiled while the claim's values stay the same, and the claim as
the registry holds it now for a body or WebSocket that outlives the request that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Claim, Credential
from proxy.core.scrub import Compiled, compile_pairs
from proxy.core.scrubmatch import extend
from proxy.core.sigv4 import sigv4_pairs
from proxy.engine.state import State
from proxy.store.live import live_values
from proxy.store.registry import StoreValue


def pairs(claim: Claim, now: float) -> list[tuple[bytes, bytes]]:
    """Every live value of every credential (proxy.store.live), each with its credential's placeholder."""
    out = []
    for c in claim.credentials:
        out += credential_pairs(c, now)
    return out


def credential_pairs(c: Credential, now: float) -> list[tuple[bytes, bytes]]:
    """One credential's live values, each with its placeholder."""
    out = []
    for secret in live_values(c, now):
        if c.sigv4 is not None:  # the real key id, secret key and token, each to its placeholder
            out += sigv4_pairs(secret.reveal(), c.placeholder, c.sigv4)
        out.append((secret.reveal().encode(), c.placeholder.encode()))
    return out


type Memo = dict[int, tuple[Credential, list[tuple[bytes, bytes]]]]


def _pairs(claim: Claim, now: float, memo: Memo) -> tuple[tuple[tuple[bytes, bytes], ...], Memo]:
    """``pairs(claim, now)``, with the pairs of a store credential already read for this claim
    (the same Credential object: its value and previous values are fixed for its life, see
    :class:`PairCache`) taken from ``memo``; and the memo for the next time."""
    out: list[tuple[bytes, bytes]] = []
    kept: Memo = {}
    for c in claim.credentials:
        known = memo.get(id(c))
        if known is not None and known[0] is c:
            got = known[1]
        else:
            got = credential_pairs(c, now)
            if not _settled(c):
                out += got
                continue
        kept[id(c)] = (c, got)
        out += got
    return tuple(out), kept


def _settled(c: Credential) -> bool:
    """A store credential whose current value was read: its pairs stay what they are now."""
    if not isinstance(c.source, StoreValue):
        return False
    try:
        c.secret()
    except SecretUnavailable:
        return False
    return True


_CLAIMS_KEPT = 256
# a claim's patterns are extended with the pairs its new values add (not compiled again) while
# those, and the pairs kept that no value holds any more, stay under this share of its pairs
_DELTA_SHARE, _DELTA_MIN = 64, 32
Pairs = tuple[tuple[bytes, bytes], ...]


@dataclass(slots=True)
class _Kept:
    claim: Claim
    volatile: tuple[tuple[Any, Any], ...]
    pairs: Pairs
    compiled: Compiled
    base: Compiled  # compiled whole; ``compiled`` is it extended with ``added``
    matched: frozenset[tuple[bytes, bytes]]  # the pairs ``base`` holds
    memo: Memo  # the newest entry of a claim id: its store credentials' pairs


class PairCache:
    """``pairs`` of each claim, kept while its values stay the same, so a claim with thousands
    of credentials does not pay a pass over them (and a hash of them all) on every response.

    A store claim's values (and its live previous ones) are fixed for the life of its Claim
    object: the registry builds a new one when the store changes. A rules-file value (``file:``
    re-read on change, ``env:``) may change under the same Claim: those credentials' current
    Secret objects are compared by identity on each use (a changed value is a new object). A
    claim with an unreadable value is not kept: the next response reads again.

    A new Claim object for a claim id already kept (a credential added, replaced or deleted)
    does not compile every value again (~2 s for 10,000 secrets, issue 14): the patterns compiled
    whole last time are extended with the pairs not in them (:func:`proxy.core.scrubmatch.extend`),
    while those and the pairs no value holds any more (a deleted or replaced value, still
    scrubbed: replacing a secret by its placeholder is never worse than passing it) stay under
    1/64 of the claim's pairs (at least 32); past that, it is compiled whole again.
    """

    def __init__(self) -> None:
        self._kept: dict[int, _Kept] = {}  # by id() of the Claim object (an old one stays kept)
        self._latest: dict[str, _Kept] = {}  # by claim id: the newest, to extend for the next

    def get(self, claim: Claim, now: float) -> tuple[Pairs, Compiled]:
        """The claim's (secret, placeholder) pairs and their compiled patterns."""
        entry = self._kept.get(id(claim))
        if entry is not None and entry.claim is claim:
            try:
                if all(c.secret()[0] is s for c, s in entry.volatile):
                    return entry.pairs, entry.compiled
            except SecretUnavailable:
                pass
        latest = self._latest.get(claim.id)
        found, memo = _pairs(claim, now, latest.memo if latest is not None else {})
        kept = _compile(latest, found, claim, memo)
        volatile = []
        try:
            volatile = [(c, c.secret()[0]) for c in claim.credentials if not isinstance(c.source, StoreValue)]
        except SecretUnavailable:
            self._kept.pop(id(claim), None)
            return found, kept.compiled
        if len(self._kept) >= _CLAIMS_KEPT:
            self._kept.clear()
            self._latest.clear()
        kept.volatile = tuple(volatile)
        if latest is not None and latest is not kept:
            latest.memo = {}  # only the newest is read from
        self._kept[id(claim)] = self._latest[claim.id] = kept
        return found, kept.compiled


def _compile(latest: _Kept | None, found: Pairs, claim: Claim, memo: Memo) -> _Kept:
    """``found`` compiled: ``latest``'s whole compilation extended with the pairs it lacks while
    those and the pairs it holds that ``found`` does not stay few enough, else compiled whole."""
    if latest is not None:
        now = set(found)
        added = tuple(p for p in dict.fromkeys(found) if p not in latest.matched)
        stale = len(latest.matched) - (len(now) - len(added))
        if len(added) + stale <= max(_DELTA_MIN, len(now) // _DELTA_SHARE):
            compiled = extend(latest.base, added) if added else latest.base
            return _Kept(claim, (), found, compiled, latest.base, latest.matched, memo)
    compiled = compile_pairs(found)
    return _Kept(claim, (), found, compiled, compiled, frozenset(found), memo)


def claims_now(claim: Claim, state: State | None) -> list[Claim]:
    """The claim a WebSocket was opened with and, when the registry holds another object for its
    id now (a store credential added or its value replaced: the registry rebuilds the claim),
    that one first. A WebSocket outlives the request that decided it; a value replaced while it
    is open may reach the upstream on another connection and come back on this one (review r4).
    Both are scrubbed with: replacing any secret by its placeholder is never worse than passing it."""
    fresh = state.registry.claim(claim.id) if state is not None else None
    return [claim] if fresh is None or fresh is claim else [fresh, claim]
