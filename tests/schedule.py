"""Longest-first order of the suite's xdist scopes, from each module's measured seconds.

xdist's scope scheduler hands a worker the next scope when it is almost out of work; by default
(``--loadscope-reorder``) the queue is ordered by *test count*, which puts a module of a few slow
end-to-end tests (a browser, five-second heartbeats, namespaces) last, and one worker then runs it
alone while the other is idle. Ordered by *time*, longest first, the last scopes handed out are
short ones and both workers finish together (LPT scheduling).

A module's seconds come from, first, this machine's last run of it (``.pytest_cache``, key
:data:`CACHE_KEY`, written at the end of every session in the controller), then the committed
table ``tests/durations.json`` (a clean clone: no cache yet), else an estimate from its tier and
test count (:func:`estimate`). A scope's seconds are the sum of its modules' (the network-namespace
scope is several modules). ``--store-durations`` writes this run's module seconds into
``tests/durations.json`` too (merged: a partial run updates only its modules). Its figures are
the module seconds of a clean-clone ``.ci/run`` on the 2-core machine (two xdist workers, 700 s
in all): they order the modules; a module's seconds vary with the load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

CACHE_KEY = "surrogate/module-seconds"
TABLE = Path(__file__).with_name("durations.json")
# Unmeasured modules: an end-to-end or adversarial test starts real processes (about a second);
# a unit test is milliseconds. Only the order matters, not the figures.
PER_TEST = {"e2e": 1.0, "adversarial": 0.7}
PER_UNIT_TEST = 0.02


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def estimate(module: str, tests: int) -> float:
    """Seconds guessed for an unmeasured module of ``tests`` tests, by its folder (its tier)."""
    parts = module.split("/")
    tier = parts[1] if len(parts) > 2 else ""
    return tests * PER_TEST.get(tier, PER_UNIT_TEST)


def read_table(path: Path = TABLE) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def write_table(measured: Mapping[str, float], path: Path = TABLE) -> None:
    """Merge ``measured`` into the committed table (sorted, one module a line, 0.1 s)."""
    table = read_table(path) | {k: round(v, 1) for k, v in measured.items()}
    path.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")


def order(scopes: Mapping[str, Iterable[str]], known: Mapping[str, float]) -> list[str]:
    """The scopes, longest first. ``scopes`` maps a scope to its test node ids; ``known`` is the
    measured seconds per module; a module without a figure gets :func:`estimate`. Ties keep the
    collection order (a stable sort)."""
    seconds: dict[str, float] = {}
    for scope, nodeids in scopes.items():
        counts: dict[str, int] = {}
        for nodeid in nodeids:
            module = module_of(nodeid)
            counts[module] = counts.get(module, 0) + 1
        seconds[scope] = sum(known.get(m, estimate(m, n)) for m, n in counts.items())
    return sorted(scopes, key=lambda s: -seconds[s])
