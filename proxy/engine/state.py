"""The proxy's live state, shared by the addons: the claims in force and the address pins.

``registry.policy`` is replaced in one assignment on reload, so the very next request sees it;
``registry`` rebuilds its store-backed claims when the store changes. ``counters`` are the
node's, shared by every worker (connections, rates, hook processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.core.policy import Policy
from proxy.metrics import Metrics
from proxy.store.counters import Counters, SharedCounters
from proxy.store.registry import Registry


@dataclass(slots=True)
class State:
    registry: Registry
    pins: dict[str, str] = field(default_factory=dict)  # canonical host -> IP, like curl --resolve
    own_ports: set[int] = field(default_factory=set)  # surrogate's listening TCP ports
    metrics: Metrics = field(default_factory=Metrics)
    counters: Counters = field(default_factory=SharedCounters.anonymous)  # node-wide (store/counters.py)

    @property
    def policy(self) -> Policy:
        return self.registry.policy
