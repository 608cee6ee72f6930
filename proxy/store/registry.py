"""The claims in force: the rules file's, plus the run-time store's, as one index.

The store is the single source of truth for run-time claims; this index is a cache of it that
is rebuilt whenever the store's ``data_version()`` moves (another process's commit included), and
the check is made at the start of every request, so a change acknowledged by the control API is
used by the very next request, inside already-open tunnels too.

Values of store credentials are decrypted on first use after a rebuild and kept in memory for
that version only. A store that can list its changes since a version (the PostgreSQL store's
``changes_since``; the SQLite store's for this process's own writes, :mod:`proxy.store.localchanges`)
is re-read incrementally; others, a reader too far behind, and a SQLite reader after another
process's commit, whole. Either
way only what changed is built: :mod:`proxy.store.mirror` applies a change to the credentials
it touched (a write to one of a claim's 10,000 credentials builds one), and a whole snapshot is
compared with the rows held first.
Rules-file claims win on an id clash (the control API refuses such ids).

Staleness (issue 14, :mod:`proxy.store.freshness`): :attr:`Registry.freshness` says when the
index was last known current; :meth:`Registry.stale` is ``never_synced`` / ``stale`` / None, and
the identify addon refuses store claims' requests while it is not None. While the store fails,
it is read at most once a second, and a value or proxy token is answered from what this node
already read (a value decrypted since the last change, a token that matched before) rather
than by waiting for the database; previous values not yet read are not scrubbed meanwhile,
budgets count as spent (fail closed) and last-use times are not recorded.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.core import slots
from proxy.core.errors import SecretUnavailable, SurrogateError
from proxy.core.hosts import HostPattern
from proxy.core.oauth import OAuthSpec, parse_spec
from proxy.core.policy import (
    DEFAULT_SURFACES,
    Claim,
    Credential,
    Injection,
    Misplaced,
    Network,
    Policy,
    Surface,
    TokenCheck,
)
from proxy.core.secrets import Secret, checked_value
from proxy.store import kindbuild
from proxy.store.base import Changes, CredentialRecord
from proxy.store.freshness import Freshness, State
from proxy.store.mirror import Mirror
from proxy.store.mirror import shape as _shape
from proxy.store.rows import token_hash

if TYPE_CHECKING:
    from proxy.store.base import CredentialStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StoreValue:
    """A store credential's value (decrypted on first use, then kept for this version)."""

    store: CredentialStore = field(repr=False)
    claim_id: str
    name: str
    _cached: tuple[Secret, int] | None = field(default=None, repr=False)
    _history: list[tuple[Secret, float]] | None = field(default=None, repr=False)
    freshness: Freshness | None = field(default=None, repr=False, compare=False)

    def current(self) -> tuple[Secret, int]:
        if self._cached is None:
            if self.freshness is not None and self.freshness.failing:  # do not wait for a failing store
                who = f"credential {self.name!r} of claim {self.claim_id!r}"
                raise SecretUnavailable(f"{who} cannot be read: the store is unreachable")
            try:
                raw, version = self.store.secret(self.claim_id, self.name)
                value = checked_value(raw.decode("utf-8"), f"credential {self.name!r}")
            except (SurrogateError, UnicodeDecodeError) as e:
                raise SecretUnavailable(
                    f"credential {self.name!r} of claim {self.claim_id!r} cannot be read: {type(e).__name__}"
                ) from None
            self._cached = (Secret(value), version)
        return self._cached

    def previous(self, since: float) -> list[Secret]:
        """Previous values kept by the store, superseded at or after ``since``, newest first
        (decrypted once per version of this credential; unreadable ones are skipped)."""
        if self._history is None:
            if self.freshness is not None and self.freshness.failing:
                return []  # not waited for while the store fails (the current value is still scrubbed)
            try:
                rows = self.store.previous_secrets(self.claim_id, self.name)
            except SurrogateError as e:
                log.warning("previous values of credential %r unreadable: %s", self.name, type(e).__name__)
                rows = []
            self._history = [(Secret(v.decode("utf-8", "replace")), at) for v, _, at in rows]
        return [s for s, at in self._history if at >= since]


@dataclass(frozen=True, slots=True)
class StoreToken:
    """A store claim's proxy token check. One is kept per generation of the claim (a rotation
    bumps the claim's version: another is built), so a token that matched is remembered (its
    hash, as the store keeps it) and answered from memory while the store fails."""

    store: CredentialStore = field(repr=False)
    claim_id: str
    freshness: Freshness | None = field(default=None, repr=False, compare=False)
    _matched: set[bytes] = field(default_factory=set, repr=False, compare=False)

    def matches(self, token: str) -> bool:
        digest = token_hash(token)
        if self.freshness is not None and self.freshness.failing:
            return any(hmac.compare_digest(digest, known) for known in self._matched)
        try:
            ok = self.store.check_token(self.claim_id, token)
        except SurrogateError:
            return False
        if ok:
            self._matched.add(digest)
        return ok


def oauth_spec(doc: dict[str, Any]) -> OAuthSpec | None:
    """A stored spec (validated when it was written); None if it no longer parses."""
    try:
        return parse_spec(doc)
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _pattern(host: str) -> HostPattern:
    return HostPattern.parse(host)


class Registry:
    def __init__(self, policy: Policy, store: CredentialStore | None = None) -> None:
        self.policy = policy
        self.store = store
        self._seen: int | None = None
        self._mirror = Mirror()  # the store's rows as last read, and what was built of them
        # (the mirror's own dicts, changed in place by it)
        self._store_claims, self._versions = self._mirror.claims, self._mirror.versions
        self._built = self._mirror.built
        self._by_source: list[tuple[Network, Claim]] = []
        self._spent: dict[tuple[str, str], int] = {}  # rules-file credentials: requests counted
        self.freshness = Freshness(getattr(store, "stale_after", None))
        self._index_sources()

    def stale(self, now: float | None = None) -> State:
        """``never_synced`` / ``stale`` while store claims must be refused, else None (no store,
        or a copy within the bound). ``now``: ``time.monotonic()``."""
        if self.store is None:
            return None
        return self.freshness.state(time.monotonic() if now is None else now)

    def replace_policy(self, policy: Policy) -> None:
        """Put new rules in force (one assignment: the next request sees them)."""
        self.policy = policy
        self._index_sources()

    def generation(self, claim_id: str) -> tuple[int, float] | None:
        """The store claim ``claim_id`` as of the last rebuild: its version and creation time
        (None: no such store claim). Any change of the claim (its token rotated, the claim
        deleted, or deleted and created again under the same id) gives another value."""
        return self._versions.get(claim_id)

    def claim(self, claim_id: str) -> Claim | None:
        return self.policy.claims.get(claim_id) or self._store_claims.get(claim_id)

    def claim_for_source(self, address: str) -> Claim | None:
        """The claim whose sources hold ``address`` (transparent mode); the longest prefix wins."""
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        for net, claim in self._by_source:
            if ip.version == net.version and ip in net:
                return claim
        return None

    def _index_sources(self) -> None:
        pairs = [
            (n, c) for c in (*self._store_claims.values(), *self.policy.claims.values()) for n in c.sources
        ]
        self._by_source = sorted(pairs, key=lambda p: -p[0].prefixlen)

    def refresh(self) -> set[str]:
        """Rebuild from the store if it changed. Returns the ids of store claims that were
        deleted or changed (token rotated, or deleted and created again) since the last rebuild:
        their tunnels must close.

        A store that can say what changed since a version (``changes_since``: the PostgreSQL
        store; the SQLite store for this process's own writes) is read incrementally: one write
        costs the rows it wrote, not a snapshot of every credential; a store that cannot, or a
        reader too far behind, or a SQLite reader after another process's commit, is read whole."""
        if self.store is None:
            return set()
        now = time.monotonic()
        if not self.freshness.may_read(now):
            return set()
        try:
            version_at = getattr(self.store, "data_version_at", None)
            version, known_at = version_at() if version_at is not None else (self.store.data_version(), now)
            if version == self._seen:
                self.freshness.synced(version, known_at)
                return set()
            since = getattr(self.store, "changes_since", None)
            changes: Changes | None = since(self._seen) if since and self._seen is not None else None
            if changes is None:
                claims, creds = self.store.snapshot()
                changes = Changes(version, claims, creds, [], [], self.store.oauth_specs())
                full = True
            else:
                full = False
        except SurrogateError as e:  # keep serving the last good index, within the bound
            if not self.freshness.failing:
                log.warning("credential store unreadable, keeping the last index: %s", e)
            self.freshness.failed(now)
            return set()
        gone = self._apply(changes, full)
        self.freshness.synced(changes.version, known_at)
        return gone

    def _apply(self, changes: Changes, full: bool) -> set[str]:
        """Put ``changes`` in force (``full``: they are the whole store). Returns the ids of
        store claims deleted or changed. Only what changed is built (:mod:`proxy.store.mirror`)."""
        mirror = self._mirror
        gone, sourced = mirror.apply(mirror.diff(changes) if full else changes, self._credential, self._token)
        self._seen = changes.version
        if sourced:  # transparent mode's index holds Claim objects: the new ones replace the old
            self._index_sources()
        return gone

    def _token(self, claim_id: str, same: Claim | None) -> TokenCheck:
        """A store claim's token check: the one of ``same`` (the Claim held of the same
        generation), which remembers the tokens it matched, else a new one."""
        assert self.store is not None
        if same is not None and isinstance(same.proxy_token, StoreToken):
            return same.proxy_token
        return StoreToken(self.store, claim_id, self.freshness)

    def _credential(self, r: CredentialRecord, spec: dict[str, Any] | None) -> Credential:
        """The core's credential for a store row; the one already built when its row (but for the
        use counters) and OAuth spec are unchanged (so its decrypted value is kept). Not the
        version alone: a credential deleted and created again is at version 1 again."""
        assert self.store is not None
        oauth = oauth_spec(spec) if spec is not None else None
        known = self._built.get((r.claim_id, r.name))
        if known is not None and known[0] == _shape(r) and known[1].oauth == oauth:
            return known[1]
        value = StoreValue(self.store, r.claim_id, r.name, freshness=self.freshness)
        made: dict[str, Any] = {
            "source": value,
            "inject": Injection(r.inject_header, r.inject_format or "{value}") if r.inject_header else None,
            "surfaces": DEFAULT_SURFACES if r.surfaces is None else frozenset(map(Surface, r.surfaces)),
            **kindbuild.fields(r, self.store, value, self.freshness),  # issue 15: a kind's own fields
        }
        return Credential(
            r.name,
            r.placeholder,
            tuple(_pattern(h) for h in r.hosts),
            expires_at=r.expires_at,
            max_requests=r.max_requests,
            on_misplaced=Misplaced(r.on_misplaced or Misplaced.CARRY),
            oauth=oauth,
            headers=slots.DEFAULT_HEADERS if r.headers is None else frozenset(r.headers),
            basic_parts=slots.DEFAULT_BASIC_PARTS
            if r.basic_parts is None
            else frozenset(map(slots.BasicPart, r.basic_parts)),
            **made,
        )

    def spend(self, claim: Claim, names: list[str]) -> str | None:
        """Count one request carrying the secrets of credentials ``names`` against their budgets
        (``max_requests``). Returns the name of a credential whose budget is spent (the request
        must then be refused), else None.

        Every budget is counted in the store, one atomic commit per use, so the count is shared
        by every worker (a budget of N is never exceeded on the node) and survives restarts:
        store credentials in their own row, rules-file credentials per (claim, credential name)
        in ``rules_budgets`` (kept across reloads). A store failure counts as spent (fail
        closed). With no store (tests) rules-file budgets are counted in this process's memory.
        The rules-file budgets of one request are counted all or none; store credentials' in
        order (rare: two metered store credentials in one request may spend the first when the
        second is refused).
        """
        metered = [c for c in claim.metered if c.name in names]  # not a walk over every credential
        if not metered:
            return None
        if claim.origin != "store" and self.store is not None:
            return self._spend_rules(claim, metered)
        if claim.origin != "store" or self.store is None:
            for c in metered:
                if self._spent.get((claim.id, c.name), 0) >= (c.max_requests or 0):
                    return c.name
            for c in metered:
                self._spent[claim.id, c.name] = self._spent.get((claim.id, c.name), 0) + 1
            return None
        for c in metered:
            if self.freshness.failing:  # not waited for: a use the store cannot count is refused
                return c.name
            try:
                if not self.store.spend(claim.id, c.name):
                    return c.name
            except SurrogateError as e:
                log.warning("could not count a use of credential %r: %s", c.name, e)
                return c.name
        return None

    def _spend_rules(self, claim: Claim, metered: list[Credential]) -> str | None:
        assert self.store is not None
        if self.freshness.failing:  # not waited for: a use the store cannot count is refused
            return metered[0].name
        try:
            return self.store.spend_rules_budgets(claim.id, [(c.name, c.max_requests or 0) for c in metered])
        except SurrogateError as e:
            log.warning("could not count a use of credential %r: %s", metered[0].name, e)
            return metered[0].name

    def record_use(self, claim: Claim, names: list[str], now: float) -> None:
        """Note the last-used time of store credentials (rate-limited by the store)."""
        if self.store is None or claim.origin != "store" or self.freshness.failing:
            return  # a hint: not worth a wait for a store that fails
        for name in names:
            try:
                self.store.touch_used(claim.id, name, now)
            except SurrogateError as e:
                log.warning("could not record last use of credential %r: %s", name, e)
