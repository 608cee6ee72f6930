"""The loaded policy as frozen plain objects: pools, egress rules, claims and credentials.

Built by :mod:`proxy.rules.loader` from a rules file, and by :mod:`proxy.store.registry` from the run-time
store; read by the decision and substitution core. Nothing here does I/O except through a
credential's ``source`` and a claim's ``proxy_token``, which read the value where it lives
(environment, file, or the encrypted store).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from proxy.core.approvals import Ask, Notify
from proxy.core.errors import Problem, SecretUnavailable
from proxy.core.hosts import HostPattern
from proxy.core.limits import Limits
from proxy.core.secrets import Secret
from proxy.core.slots import DEFAULT_BASIC_PARTS, DEFAULT_HEADERS, BasicPart

# A claim's ``interface`` (transparent mode, addons/fence.py): a Linux interface name
# (IFNAMSIZ is 16 bytes with the NUL), in the rules file and in the store alike.
INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")

if TYPE_CHECKING:
    from proxy.core.hmacsign import SignSpec
    from proxy.core.hooks import HookRoute
    from proxy.core.mint import Minting
    from proxy.core.oauth import OAuthSpec
    from proxy.core.sigv4 import SigV4Spec

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class SecretSource(Protocol):
    """Where a credential's value is read: ``current()`` gives ``(Secret, version)`` or raises
    SecretUnavailable."""

    def current(self) -> tuple[Secret, int]: ...


class TokenCheck(Protocol):
    """A claim's proxy credential: ``matches(token)`` compares in constant time."""

    def matches(self, token: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class SourceToken:
    """A proxy token read from a value source (rules-file claims)."""

    source: SecretSource = field(repr=False)

    def matches(self, token: str) -> bool:
        try:
            expected, _ = self.source.current()
        except SecretUnavailable:
            return False
        return hmac.compare_digest(token.encode(), expected.reveal().encode())


@dataclass(frozen=True, slots=True)
class EgressRule:
    """One egress rule. ``methods``/``ports`` empty means any; ``paths`` are segment-aware prefixes."""

    id: str  # "pool.egress[i]", stable for audit and explanations
    host: HostPattern
    ports: frozenset[int]
    methods: frozenset[str]
    paths: tuple[str, ...]
    intercept: bool
    report: bool = False  # report mode: allow what this rule would refuse, and audit would_deny
    scheme: str = "https"  # "https": CONNECT and https:// requests; "http": plain http:// only
    approve: Ask | None = None  # requests it allows only once an operator approves (issue 16)

    def label(self) -> str:
        return f"{self.id} {self.host}"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    egress: tuple[EgressRule, ...]
    allow_reroute: bool = False  # transparent mode: may the Host/SNI name another address?
    allow_cidrs: tuple[Network, ...] = ()  # special-purpose networks this pool may still reach
    report: bool = False  # report mode for the whole pool
    limits: Limits = Limits()  # per-claim connections and request rate (proxy/core/limits.py)
    unsafe_any_host: bool = False  # a '*' egress rule may stand beside credentials
    hooks: tuple[HookRoute, ...] = ()  # routes an operator command answers (proxy.core.hooks)

    def any_host_rule(self) -> EgressRule | None:
        """The first '*' egress rule, when credentials may not live beside it (else None)."""
        if self.unsafe_any_host:
            return None
        return next((r for r in self.egress if r.host.any_host), None)


@dataclass(frozen=True, slots=True)
class Injection:
    """Set header ``header`` to ``format`` with ``{value}`` replaced by the secret."""

    header: str
    format: str


class Surface(StrEnum):
    """Where in a request a placeholder was found, and where a credential lets it be swapped.

    ``path`` is never swappable: it only names where a carried or refused placeholder was.
    ``userinfo`` enables the same swap as ``basic``: clients send URL userinfo as Basic
    credentials (RFC 9110 §4.2.4 forbids sending it in the URI; mitmproxy refuses a request line
    that holds it), so at the proxy the two are one surface.
    """

    HEADER = "header"
    BASIC = "basic"
    QUERY = "query"
    USERINFO = "userinfo"
    BODY = "body"
    PATH = "path"


SURFACES = (Surface.HEADER, Surface.BASIC, Surface.QUERY, Surface.USERINFO, Surface.BODY)  # configurable
DEFAULT_SURFACES = frozenset({Surface.HEADER, Surface.BASIC})


class Misplaced(StrEnum):
    """What happens to a placeholder found on a surface its credential does not enable (or in a
    body toward a host it is not bound to): passed inert, refused with 403, or the connection
    closed."""

    CARRY = "carry"
    BLOCK = "block"
    TERMINATE = "terminate"


@dataclass(frozen=True, slots=True)
class Credential:
    name: str
    placeholder: str
    hosts: tuple[HostPattern, ...]
    source: SecretSource = field(repr=False)
    inject: Injection | None = None
    expires_at: float | None = None  # unix seconds; None: never
    max_requests: int | None = None  # request budget (counted by the registry); None: none
    surfaces: frozenset[Surface] = DEFAULT_SURFACES
    on_misplaced: Misplaced = Misplaced.CARRY
    oauth: OAuthSpec | None = None  # token capture: this credential is the refresh token (proxy.core.oauth)
    # the slots (proxy.core.slots): lower-cased header names the header surface swaps in, and the
    # parts of Basic credentials the basic surface swaps in
    headers: frozenset[str] = DEFAULT_HEADERS
    basic_parts: frozenset[BasicPart] = DEFAULT_BASIC_PARTS
    # credential kinds beyond a static value (issue 15): "oauth_client" mints its value
    kind: str = "static"
    mint: Minting | None = field(default=None, repr=False)  # oauth_client (proxy.core.mint)
    sign: SignSpec | None = None  # hmac (proxy.core.hmacsign)
    sigv4: SigV4Spec | None = None  # kind aws_sigv4: re-signed, never swapped (proxy.core.sigv4)

    def enables(self, surface: Surface) -> bool:
        """True when a placeholder found on ``surface`` may be swapped (toward a bound host)."""
        if surface is Surface.BASIC:
            return Surface.BASIC in self.surfaces or Surface.USERINFO in self.surfaces
        return surface in self.surfaces

    def swaps_in_header(self, name: bytes) -> bool:
        """True when a placeholder spelled raw in the value of header ``name`` may be swapped."""
        return Surface.HEADER in self.surfaces and name.decode("latin-1").lower() in self.headers

    def swaps_in_basic(self, part: BasicPart) -> bool:
        """True when a placeholder in this part of Basic credentials may be swapped."""
        return self.enables(Surface.BASIC) and part in self.basic_parts

    def placeholders(self) -> tuple[str, ...]:
        """Every placeholder the sandbox holds for it: an aws_sigv4 credential's secret key and
        session token placeholders too, so that they are this claim's (never forged) and a
        violation toward an unbound host wherever they appear."""
        if self.sigv4 is None:
            return (self.placeholder,)
        more = (self.sigv4.placeholder_secret, self.sigv4.placeholder_token)
        return (self.placeholder, *(p for p in more if p is not None))

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def bound_to(self, host: str) -> bool:
        """True when canonical ``host`` is one this credential may be sent to."""
        return any(p.matches(host) for p in self.hosts)

    def secret(self) -> tuple[Secret, int]:
        """Current value and version; raises SecretUnavailable."""
        return self.source.current()


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    pool: str
    proxy_token: TokenCheck = field(repr=False)
    credentials: tuple[Credential, ...]
    injections: tuple[Credential, ...] = field(repr=False, compare=False)
    by_placeholder: dict[bytes, Credential] = field(repr=False, compare=False)
    origin: str = "rules"  # "rules" (the rules file) or "store" (the control API)
    sources: tuple[Network, ...] = ()  # transparent mode: the sandbox's source addresses
    # Computed once by build, so that per-request work does not grow with the credential count:
    body: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # enable "body"
    refusing: bool = field(default=False, repr=False, compare=False)  # some on_misplaced refuses
    oauth: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # token endpoints
    metered: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # max_requests
    interface: str | None = None  # transparent mode: the interface its connections must arrive on
    kinded: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # kind not static
    sigv4: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # kind aws_sigv4
    signing: tuple[Credential, ...] = field(default=(), repr=False, compare=False)  # kind hmac

    @classmethod
    def build(
        cls,
        claim_id: str,
        pool: str,
        token: TokenCheck,
        credentials: tuple[Credential, ...],
        origin: str = "rules",
        sources: tuple[Network, ...] = (),
        interface: str | None = None,
    ) -> Claim:
        return cls(
            claim_id,
            pool,
            token,
            credentials,
            tuple(c for c in credentials if c.inject is not None),
            {p.encode(): c for c in credentials for p in c.placeholders()},
            origin,
            sources,
            tuple(c for c in credentials if Surface.BODY in c.surfaces),
            any(c.on_misplaced is not Misplaced.CARRY for c in credentials),
            tuple(c for c in credentials if c.oauth is not None),
            tuple(c for c in credentials if c.max_requests is not None),
            interface,
            tuple(c for c in credentials if c.kind != "static"),
            tuple(c for c in credentials if c.sigv4 is not None),
            tuple(c for c in credentials if c.sign is not None),
        )


@dataclass(frozen=True, slots=True)
class Policy:
    source: str  # the rules file this came from
    pools: dict[str, Pool]
    claims: dict[str, Claim]
    warnings: tuple[Problem, ...] = ()  # risky but valid: said by `rules check`, logged at start
    notify: Notify | None = None  # top-level `approvals.notify`: told of each new pending approval
