"""One claim's credentials, kept so that a change of one credential costs that credential.

:meth:`Claim.build <proxy.core.policy.Claim.build>` derives, from all of a claim's credentials,
the views the request path reads (the placeholder index the scanner and the forgery check look
placeholders up in, the injections, the body, OAuth and metered subsets, whether any credential
refuses misplaced placeholders): a pass over every credential. A store claim with 10,000
credentials paid that pass, in Python, on every node for every write to any of them (issue 14).
:class:`ClaimIndex` keeps the same views updated one credential at a time (:meth:`put`,
:meth:`remove`: a binary search and a few list and dict operations), and :meth:`claim` takes a
:class:`Claim` of them with C-level copies only (a tuple of a list, a dict copy). A Claim stays a
frozen snapshot: flows and the scrubber's cache that hold an older one keep seeing exactly it.

Equal to ``Claim.build`` (the tests compare every field after any sequence of puts and removes):
credentials in name order (the registry builds claims sorted by name), each subset in the same
order, and a placeholder held by two credentials of the claim (the store refuses that; a hand-made
claim may not) indexed to the later name, as the comprehension in ``Claim.build`` leaves it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable

from proxy.core.policy import Claim, Credential, Misplaced, Network, Surface, TokenCheck

# the subsets Claim.build derives, each with the test it filters credentials by
_SUBSETS: dict[str, Callable[[Credential], bool]] = {
    "injections": lambda c: c.inject is not None,
    "body": lambda c: Surface.BODY in c.surfaces,
    "oauth": lambda c: c.oauth is not None,
    "metered": lambda c: c.max_requests is not None,
    "kinded": lambda c: c.kind != "static",
    "sigv4": lambda c: c.sigv4 is not None,
    "signing": lambda c: c.sign is not None,
}


class _Sorted:
    """Credentials in name order (two parallel lists: bisect on the names)."""

    __slots__ = ("creds", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.creds: list[Credential] = []

    def put(self, c: Credential) -> Credential | None:
        """Add ``c`` or replace the one of its name; returns the one replaced."""
        i = bisect_left(self.names, c.name)
        if i < len(self.names) and self.names[i] == c.name:
            old, self.creds[i] = self.creds[i], c
            return old
        self.names.insert(i, c.name)
        self.creds.insert(i, c)
        return None

    def remove(self, name: str) -> Credential | None:
        i = bisect_left(self.names, name)
        if i < len(self.names) and self.names[i] == name:
            del self.names[i]
            return self.creds.pop(i)
        return None


class ClaimIndex:
    """A claim's credentials by name, with the views :class:`Claim` holds, kept current per
    credential. Not thread-safe: one writer (the registry's refresh); readers get Claims."""

    def __init__(self, credentials: Iterable[Credential] = ()) -> None:
        self._all = _Sorted()
        self._subsets = {name: _Sorted() for name in _SUBSETS}
        self._refusing: set[str] = set()
        self._by_placeholder: dict[bytes, Credential] = {}
        # placeholders held by more than one credential: the holders that do not win, by name
        self._shadowed: dict[bytes, dict[str, Credential]] = {}
        for c in credentials:
            self.put(c)

    def __len__(self) -> int:
        return len(self._all.names)

    def get(self, name: str) -> Credential | None:
        i = bisect_left(self._all.names, name)
        return self._all.creds[i] if i < len(self._all.names) and self._all.names[i] == name else None

    def put(self, credential: Credential) -> None:
        """Add ``credential``, or replace the claim's credential of its name."""
        old = self._all.put(credential)
        if old is not None:
            self._unindex(old)
        for name, wanted in _SUBSETS.items():
            if wanted(credential):
                self._subsets[name].put(credential)
            elif old is not None:
                self._subsets[name].remove(credential.name)
        if credential.on_misplaced is not Misplaced.CARRY:
            self._refusing.add(credential.name)
        else:
            self._refusing.discard(credential.name)
        for p in dict.fromkeys(credential.placeholders()):
            self._index(p.encode(), credential)

    def remove(self, name: str) -> None:
        """Remove the credential ``name`` (none: nothing happens)."""
        old = self._all.remove(name)
        if old is None:
            return
        self._unindex(old)
        for subset in self._subsets.values():
            subset.remove(name)
        self._refusing.discard(name)

    def claim(
        self,
        claim_id: str,
        pool: str,
        token: TokenCheck,
        origin: str = "rules",
        sources: tuple[Network, ...] = (),
        interface: str | None = None,
    ) -> Claim:
        """A Claim of the credentials as they are now (a snapshot: later changes do not reach it);
        the same as ``Claim.build`` with them in name order."""
        s = self._subsets
        return Claim(
            id=claim_id,
            pool=pool,
            proxy_token=token,
            credentials=tuple(self._all.creds),
            injections=tuple(s["injections"].creds),
            by_placeholder=dict(self._by_placeholder),
            origin=origin,
            sources=sources,
            body=tuple(s["body"].creds),
            refusing=bool(self._refusing),
            oauth=tuple(s["oauth"].creds),
            metered=tuple(s["metered"].creds),
            interface=interface,
            kinded=tuple(s["kinded"].creds),
            sigv4=tuple(s["sigv4"].creds),
            signing=tuple(s["signing"].creds),
        )

    def _index(self, p: bytes, c: Credential) -> None:
        held = self._by_placeholder.get(p)
        if held is None or held.name == c.name:
            self._by_placeholder[p] = c
            return
        shadowed = self._shadowed.setdefault(p, {})
        if c.name > held.name:  # the later name wins, as in Claim.build
            shadowed[held.name] = held
            self._by_placeholder[p] = c
        else:
            shadowed[c.name] = c

    def _unindex(self, old: Credential) -> None:
        for p in {p.encode() for p in old.placeholders()}:
            shadowed = self._shadowed.get(p)
            held = self._by_placeholder.get(p)
            if held is not None and held.name == old.name:
                if shadowed:
                    self._by_placeholder[p] = shadowed.pop(max(shadowed))
                else:
                    del self._by_placeholder[p]
            elif shadowed is not None:
                shadowed.pop(old.name, None)
            if shadowed is not None and not shadowed:
                del self._shadowed[p]
