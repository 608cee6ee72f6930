"""The loaded policy as frozen plain objects: pools, egress rules, claims and credentials.

Built by :mod:`proxy.rules` from a rules file; read by the decision and substitution core.
Nothing here does I/O except :meth:`Credential.secret`, which reads the value source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.hosts import HostPattern
from proxy.secrets import Secret, ValueSource


@dataclass(frozen=True, slots=True)
class EgressRule:
    """One egress rule. ``methods``/``ports`` empty means any; ``paths`` are segment-aware prefixes."""

    id: str  # "pool.egress[i]", stable for audit and explanations
    host: HostPattern
    ports: frozenset[int]
    methods: frozenset[str]
    paths: tuple[str, ...]
    intercept: bool

    def label(self) -> str:
        return f"{self.id} {self.host}"


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    egress: tuple[EgressRule, ...]


@dataclass(frozen=True, slots=True)
class Injection:
    """Set header ``header`` to ``format`` with ``{value}`` replaced by the secret."""

    header: str
    format: str


@dataclass(frozen=True, slots=True)
class Credential:
    name: str
    placeholder: str
    hosts: tuple[HostPattern, ...]
    source: ValueSource = field(repr=False)
    inject: Injection | None = None

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
    proxy_token: ValueSource = field(repr=False)
    credentials: tuple[Credential, ...]
    injections: tuple[Credential, ...] = field(repr=False, compare=False)
    by_placeholder: dict[bytes, Credential] = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Policy:
    source: str  # the rules file this came from
    pools: dict[str, Pool]
    claims: dict[str, Claim]
