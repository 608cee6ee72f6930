"""Readiness: whether an orchestrator should send this node traffic (``GET /readyz``).

    200 {"ready": true,  "node": NAME, "store_version": N}
    503 {"ready": false, "node": NAME, "reason": CODE, "message": SENTENCE}

``/healthz`` stays liveness (the process answers and its store reads); ``/readyz`` is for a load
balancer or a Kubernetes readiness probe, which routes only to ready nodes. Ready means, today:

- the node's rules are loaded: a node whose rules file does not load never starts, and a reload
  that is rejected keeps the rules in force (the node stays ready; the ``reload`` audit event and
  ``surrogate_rule_reloads_total{outcome="rejected"}`` say it);
- its proxy listeners are up (``surrogate run``; reason ``starting`` until then, and ``stopping``
  once SIGTERM or SIGINT began the shutdown, so that no new traffic is routed to it);
- its credential store answers now (reason ``store_unreachable`` otherwise). ``store_version`` is
  the store's change counter as this node reads it (SQLite: it moves on every change, and each
  process counts from its own start).

With the fleet store (PostgreSQL, issue 14) and a proxy node's registry (``registry``), ready
means **synced** instead: the node has read the shared store at least once and its copy is
within the staleness bound (:mod:`proxy.store.freshness`; the copy is kept current by the
revocation poll, every 0.2 s, so the probe itself never waits for the database), and
``store_version`` is the fleet-wide version that copy is at. A node that has never synced
answers 503 ``never_synced``, one whose copy is past the bound 503 ``stale``. Within the bound
while the database is down it stays ready: it serves its last-known-good copy, as do the others.

The answer never holds a secret, a claim or a credential name; the failure message names only
the error's type (a driver's message may quote a connection string).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel

if TYPE_CHECKING:
    from proxy.store.registry import Registry

log = logging.getLogger("surrogate")


class Versioned(Protocol):
    """What readiness needs of a store: its change counter (raises when the store cannot be read)."""

    def data_version(self) -> int: ...


@dataclass(slots=True)
class Readiness:
    """One node's readiness. The engine sets ``listening`` once its proxy listeners are up and
    ``stopping`` when a shutdown begins; a ``surrogate control`` process has no proxy listener,
    so it starts with ``listening=True``."""

    store: Versioned
    node: str
    listening: bool = True
    stopping: bool = False
    registry: Registry | None = None  # a proxy node's: readiness is its copy's freshness

    def check(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) as described in the module docstring."""
        if self.stopping:
            return self._not("stopping", "the node is shutting down")
        if not self.listening:
            return self._not("starting", "the proxy's listeners are not up yet")
        registry = self.registry
        if registry is not None and registry.store is not None and registry.freshness.bound is not None:
            state = registry.stale()
            if state == "never_synced":
                return self._not(state, "the node has not read the credential store since it started")
            if state == "stale":
                return self._not(state, "the node's copy of the credential store is past its staleness bound")
            return 200, {"ready": True, "node": self.node, "store_version": registry.freshness.version}
        try:
            version = self.store.data_version()
        except Exception as e:  # any failure of the store means: not ready (fail closed)
            log.warning("readiness: the credential store did not answer: %s", type(e).__name__)
            return self._not("store_unreachable", f"the credential store did not answer ({type(e).__name__})")
        return 200, {"ready": True, "node": self.node, "store_version": version}

    def _not(self, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        return 503, {"ready": False, "node": self.node, "reason": reason, "message": message}


class ReadyOut(BaseModel):
    """The 200 answer (for the OpenAPI document)."""

    ready: Literal[True]
    node: str
    store_version: int


class NotReadyOut(BaseModel):
    """The 503 answer (for the OpenAPI document)."""

    ready: Literal[False]
    node: str
    reason: Literal["starting", "stopping", "store_unreachable", "never_synced", "stale"]
    message: str
