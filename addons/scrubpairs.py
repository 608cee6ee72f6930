"""The (secret, placeholder) pairs the scrubbers of :mod:`addons.scrub` and :mod:`addons.wsscrub`
use: every live value of a claim's credentials (current and recently replaced,
:mod:`proxy.store.live`), kept compiled while the claim's values stay the same, and the claim as
the registry holds it now for a body or WebSocket that outlives the request that decided it.
"""

from __future__ import annotations

from typing import Any

from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Claim
from proxy.core.scrub import Compiled, compile_pairs
from proxy.core.sigv4 import sigv4_pairs
from proxy.engine.state import State
from proxy.store.live import live_values
from proxy.store.registry import StoreValue


def pairs(claim: Claim, now: float) -> list[tuple[bytes, bytes]]:
    """Every live value of every credential (proxy.store.live), each with its credential's placeholder."""
    out = []
    for c in claim.credentials:
        for secret in live_values(c, now):
            if c.sigv4 is not None:  # the real key id, secret key and token, each to its placeholder
                out += sigv4_pairs(secret.reveal(), c.placeholder, c.sigv4)
            out.append((secret.reveal().encode(), c.placeholder.encode()))
    return out


_CLAIMS_KEPT = 256
Pairs = tuple[tuple[bytes, bytes], ...]


class PairCache:
    """``pairs`` of each claim, kept while its values stay the same, so a claim with thousands
    of credentials does not pay a pass over them (and a hash of them all) on every response.

    A store claim's values (and its live previous ones) are fixed for the life of its Claim
    object: the registry builds a new one when the store changes. A rules-file value (``file:``
    re-read on change, ``env:``) may change under the same Claim: those credentials' current
    Secret objects are compared by identity on each use (a changed value is a new object). A
    claim with an unreadable value is not kept: the next response reads again.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Claim, tuple[tuple[Any, Any], ...], Pairs, Compiled]] = {}

    def get(self, claim: Claim, now: float) -> tuple[Pairs, Compiled]:
        """The claim's (secret, placeholder) pairs and their compiled patterns."""
        entry = self._kept.get(id(claim))
        if entry is not None and entry[0] is claim:
            try:
                if all(c.secret()[0] is s for c, s in entry[1]):
                    return entry[2], entry[3]
            except SecretUnavailable:
                pass
        found = tuple(pairs(claim, now))
        compiled = compile_pairs(found)
        volatile = []
        try:
            volatile = [(c, c.secret()[0]) for c in claim.credentials if not isinstance(c.source, StoreValue)]
        except SecretUnavailable:
            self._kept.pop(id(claim), None)
            return found, compiled
        if len(self._kept) >= _CLAIMS_KEPT:
            self._kept.clear()
        self._kept[id(claim)] = (claim, tuple(volatile), found, compiled)
        return found, compiled


def claims_now(claim: Claim, state: State | None) -> list[Claim]:
    """The claim a WebSocket was opened with and, when the registry holds another object for its
    id now (a store credential added or its value replaced: the registry rebuilds the claim),
    that one first. A WebSocket outlives the request that decided it; a value replaced while it
    is open may reach the upstream on another connection and come back on this one (review r4).
    Both are scrubbed with: replacing any secret by its placeholder is never worse than passing it."""
    fresh = state.registry.claim(claim.id) if state is not None else None
    return [claim] if fresh is None or fresh is claim else [fresh, claim]
