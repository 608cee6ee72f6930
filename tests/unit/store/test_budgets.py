"""Request budgets (``max_requests``) hold for the whole node: every process counts into the store,
one atomic statement per use, so a budget of N allows exactly N uses however many workers ask,
and a restart does not hand out a fresh budget."""

from __future__ import annotations

import multiprocessing
import textwrap
from pathlib import Path

import canary

from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store

BUDGET = 37
PROCESSES = 4
TRIES = 25  # per process: 100 tries at a budget of 37


def _open(tmp: Path) -> Store:
    return Store.open(tmp, KeyRing.load_or_create(tmp / "store.key"))


def _rules(tmp: Path, budget: int = BUDGET) -> Path:
    canary.source(tmp / "secret", canary.make("budget"))
    (tmp / "token").write_text("t\n")
    path = tmp / "rules.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            egress: [{{host: api.test}}]
        claims:
          - id: c
            pool: p
            proxy_token: file:token
            credentials:
              - {{name: k, value: file:secret, hosts: [api.test], placeholder: surr_BudgetPlaceholder0001,
                  max_requests: {budget}}}
        """)
    )
    return path


def test_a_rules_budget_counts_exactly_n_and_survives_a_restart(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        assert [store.spend_rules_budgets("c", [("k", 2)]) for _ in range(3)] == [None, None, "k"]
        assert store.spend_rules_budgets("c", [("other", 1)]) is None  # each credential has its own count
    with _open(tmp_path) as store:  # a restarted node
        assert store.spend_rules_budgets("c", [("k", 2)]) == "k"
        assert store.spend_rules_budgets("c", [("k", 3)]) is None  # a reload that raises the budget
        assert store.spend_rules_budgets("c", [("k", 3)]) == "k"


def test_the_rules_budgets_of_one_request_are_counted_all_or_none(tmp_path: Path) -> None:
    with _open(tmp_path) as store:
        assert store.spend_rules_budgets("c", [("a", 5), ("b", 1)]) is None
        assert store.spend_rules_budgets("c", [("a", 5), ("b", 1)]) == "b"  # b is spent: a is not counted
        assert [store.spend_rules_budgets("c", [("a", 5)]) for _ in range(5)] == [None] * 4 + ["a"]
        assert store.spend_rules_budgets("c", [("z", 0)]) == "z"  # a budget below 1 allows nothing


def _spend(tmp: Path, rules: Path, results: multiprocessing.Queue[int]) -> None:
    """One worker: its own store connection and registry, as `surrogate run --worker-index I`."""
    with _open(tmp) as store:
        registry = Registry(load_rules(rules), store)
        claim = registry.claim("c")
        assert claim is not None
        results.put(sum(registry.spend(claim, ["k"]) is None for _ in range(TRIES)))


def test_workers_on_one_store_never_pass_a_rules_budget(tmp_path: Path) -> None:
    """Regression (issue 20 item 6): rules-file budgets were counted in each process's memory,
    so N workers allowed N times the budget."""
    rules = _rules(tmp_path)
    _open(tmp_path).close()  # created once, as the supervisor does
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_spend, args=(tmp_path, rules, results)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    assert sum(results.get(timeout=5) for _ in procs) == BUDGET


def test_a_store_budget_is_exact_across_store_connections(tmp_path: Path) -> None:
    with _open(tmp_path) as a, _open(tmp_path) as b:
        a.create_claim("c1", "p")
        a.put_credential("c1", "k", value=b"v", hosts=["api.test"], max_requests=3)
        got = [s.spend("c1", "k") for s in (a, b, a, b, a, b)]
    assert got == [True, True, True, False, False, False]
