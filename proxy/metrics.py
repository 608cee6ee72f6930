"""Prometheus metrics, served by the control API at ``/metrics``.

One registry per process; with ``--workers N`` the workers share their values through
prometheus-client's multiprocess mode, so ``/metrics`` (served by worker 0) counts every worker.
Label values are bounded: decisions, reason codes and status classes are fixed sets, credential
names come from the operator's rules or the control API — never a
host, path or anything else the sandbox chooses.

    surrogate_requests_total{decision, reason, status_class}   one per audited request/tunnel
    surrogate_substitutions_total{credential}                   swaps and injections
    surrogate_violations_total{credential}                      placeholders refused as violations
    surrogate_upstream_seconds                                  request start to response end
    surrogate_open_connections                                  client connections now open
    surrogate_store_operations_total{operation, outcome}        control-API store writes
    surrogate_rule_reloads_total{outcome}                       applied | rejected
    surrogate_control_requests_total{method, status_class}      control-API calls
    surrogate_limit_refusals_total{limit}                       connections | rate | header_timeout
                                                                | hook_pool | hook_node | websocket_message
                                                                | websocket_held
    surrogate_hook_processes                                    hook commands running now
    surrogate_hook_processes_limit{pool}                        their bound: a pool's, "*" the node's
    surrogate_node_info{node}                                   1: the node's name (``--node``), said
                                                                once, not as a label of every series
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess

# Set by ``surrogate run --workers N`` for its workers (prometheus-client's multiprocess mode:
# each worker writes its values to files there; /metrics sums them).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "surrogate_requests",
            "audited requests and tunnels",
            ["decision", "reason", "status_class"],
            registry=r,
        )
        self.substitutions = Counter(
            "surrogate_substitutions", "secrets swapped or injected", ["credential"], registry=r
        )
        self.violations = Counter(
            "surrogate_violations", "placeholders refused as violations", ["credential"], registry=r
        )
        self.upstream_seconds = Histogram(
            "surrogate_upstream_seconds",
            "request start to response end",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.open_connections = Gauge(
            "surrogate_open_connections",
            "client connections open now",
            registry=r,
            multiprocess_mode="livesum",  # with --workers: the sum over live workers
        )
        self.store_operations = Counter(
            "surrogate_store_operations", "control-API store writes", ["operation", "outcome"], registry=r
        )
        self.reloads = Counter("surrogate_rule_reloads", "rules reloads", ["outcome"], registry=r)
        self.limit_refusals = Counter(
            "surrogate_limit_refusals", "connections refused or closed by a limit", ["limit"], registry=r
        )
        self.hook_processes = Gauge(
            "surrogate_hook_processes",
            "hook-route commands running now",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.hook_processes_limit = Gauge(
            "surrogate_hook_processes_limit",
            'hook-route commands allowed at once: per pool, and for the node (pool="*")',
            ["pool"],
            registry=r,
            multiprocess_mode="max",  # the same bound in every worker
        )
        self.control_requests = Counter(
            "surrogate_control_requests", "control API requests", ["method", "status_class"], registry=r
        )
        self.node_info = Gauge(
            "surrogate_node_info",
            "always 1; the node label names this node (surrogate run --node)",
            ["node"],
            registry=r,
            multiprocess_mode="max",  # every worker says the same name
        )

    def name_node(self, node: str) -> None:
        """Say which node this is: ``surrogate_node_info{node=...} 1``."""
        self.node_info.labels(node).set(1)

    def exposition(self) -> CollectorRegistry:
        """The registry ``/metrics`` serves: this process's, or under ``--workers N`` one that
        sums every worker's values (read from ``$PROMETHEUS_MULTIPROC_DIR``)."""
        if not os.environ.get(MULTIPROC_ENV):
            return self.registry
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
