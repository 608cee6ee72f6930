"""proxy.store.fleetlimits against a real PostgreSQL: the lease statement is proxy.core.fleet's
arithmetic, concurrent leases never share a token, two nodes' connection counts add up, a silent
node's are given back after the heartbeat bound, and an unreachable database never admits more."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from pg import Cluster, own_pg_cluster  # noqa: F401  (a cluster this test may stop)

from proxy.core import fleet
from proxy.core.limits import ClaimLimiter, Limits
from proxy.store.counters import SharedCounters
from proxy.store.fleetlimits import FleetCounters, row_key
from proxy.store.keyring import KeyRing
from proxy.store.postgres import PostgresStore

type Node = Callable[..., FleetCounters]


@pytest.fixture
def url(pg_cluster: Cluster) -> str:
    return pg_cluster.database()


@pytest.fixture
def store(url: str, tmp_path: Path) -> Iterator[PostgresStore]:
    with PostgresStore.open(url, KeyRing.load_or_create(tmp_path / "k"), max_size=8) as s:
        yield s


@pytest.fixture
def node(store: PostgresStore) -> Iterator[Node]:
    """A fleet node over its own (anonymous) table; not started: the test ticks it (sync)."""
    made: list[FleetCounters] = []

    def make(run: str, bound: float = 5.0, local: SharedCounters | None = None) -> FleetCounters:
        table = local or SharedCounters.anonymous()
        made.append(FleetCounters(table, store, run, table.worker, run, bound=bound))
        return made[-1]

    yield make
    for n in made:
        n.stop()


def _clock(store: PostgresStore) -> float:
    with store._connection() as conn:
        row = conn.execute(b"SELECT CAST(extract(epoch FROM now()) AS double precision)").fetchone()
    assert row is not None
    return float(row[0])


@pytest.mark.parametrize(
    ("tokens", "ago", "rate", "burst", "want"),
    [(5.0, 0.0, 1.0, 10, 3), (0.0, 2.5, 1.0, 10, 3), (9.0, 100.0, 1.0, 10, 3), (0.4, 0.5, 1.0, 10, 3),
     (3.0, -5.0, 1.0, 10, 2), (20.0, 0.0, 1.0, 4, 2), (0.0, 0.01, 100.0, 200, 25)],
    ids=["spend", "refill", "capped", "fraction", "clock-behind", "lower-burst", "default-rate"],
)  # fmt: skip
def test_the_lease_statement_is_the_pure_arithmetic(
    store: PostgresStore, node: Node, tokens: float, ago: float, rate: float, burst: int, want: int
) -> None:
    n = node("a")
    with store._connection() as conn:
        row = conn.execute(
            b"INSERT INTO fleet_buckets VALUES ('c', %s, CAST(extract(epoch FROM now()) AS double precision)"
            b" - %s, 0, 0) RETURNING stamp",
            (tokens, ago),
        ).fetchone()
    assert row is not None
    stamp = float(row[0])
    before = _clock(store)
    granted, left = n._lease("c", rate, burst, want)
    after = _clock(store)
    low = fleet.lease(tokens, stamp, before, rate, burst, want)
    high = fleet.lease(tokens, stamp, after, rate, burst, want)
    assert low[0] <= granted <= high[0]
    assert low[1] + low[0] - 1e-6 <= left + granted <= high[1] + high[0] + 1e-6


def test_a_new_bucket_starts_full(node: Node) -> None:
    n = node("a")
    assert n._lease("fresh", 1.0, 5, 2) == (2, 3.0)
    assert n._lease("fresh", 1.0, 5, 9)[0] == 3


def test_concurrent_leases_never_grant_more_than_the_bucket_holds(store: PostgresStore, node: Node) -> None:
    """Sixteen threads (two runs) lease 3 at a time from a bucket of 100 that barely refills:
    exactly 100 tokens are granted in all."""
    nodes = [node("a"), node("b")]
    got: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def lease(i: int) -> None:
        barrier.wait()
        for _ in range(12):
            granted, _ = nodes[i % 2]._lease("race", 0.0001, 100, 3)
            with lock:
                got.append(granted)

    threads = [threading.Thread(target=lease, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(got) == 100


def test_a_claims_connections_add_up_over_two_nodes_and_closing_frees(node: Node) -> None:
    a, b = ClaimLimiter(node("a")), ClaimLimiter(node("b"))
    limits = Limits(connections=4)
    assert all(a.open(f"a{i}", "c", limits) for i in range(3))
    a.counters.sync()  # type: ignore[attr-defined]
    b.counters.sync()  # type: ignore[attr-defined]
    assert b.open("b0", "c", limits)
    assert not b.open("b1", "c", limits), "3 on A and 1 on B: the claim's 4"
    assert b.open("b0", "other", limits), "another claim is not affected"
    a.close("a0")
    a.counters.sync()  # type: ignore[attr-defined]
    assert not b.open("b1", "c", limits), "not seen before B reads again"
    b.counters.sync()  # type: ignore[attr-defined]
    assert b.open("b1", "c", limits)
    b.counters.sync()  # type: ignore[attr-defined]
    a.counters.sync()  # type: ignore[attr-defined]
    assert a.counters.others == {row_key("c"): 2, row_key("other"): 1}  # type: ignore[attr-defined]


def test_a_silent_nodes_connections_are_given_back_after_the_heartbeat_bound(node: Node) -> None:
    a, b = node("a", bound=1.0), node("b", bound=1.0)
    acquired = [a.acquire([("connections\0c", 4)]) for _ in range(4)]
    assert acquired == [-1] * 4
    a.sync()
    b.sync()
    assert b.others == {row_key("c"): 4} and b.acquire([("connections\0c", 4)]) == 0
    time.sleep(1.5)  # A stops beating (killed)
    b.sync()
    assert b.others == {} and b.acquire([("connections\0c", 4)]) == -1


def test_workers_of_one_node_do_not_count_each_other_twice(node: Node) -> None:
    """Two workers of run ``a`` share one table (the node's): each publishes its own column, and
    neither counts its sibling's rows as another node's."""
    table = SharedCounters.anonymous(workers=2)
    w0, w1 = node("a", local=table), node("a", local=table.view(1))
    assert w0.acquire([("connections\0c", 3)]) == -1
    assert w1.acquire([("connections\0c", 3)]) == -1
    w0.sync()
    w1.sync()
    assert w0.others == {} and w1.others == {}
    assert w1.acquire([("connections\0c", 3)]) == -1
    assert w0.acquire([("connections\0c", 3)]) == 0
    w1.sync()
    other = node("b")
    other.sync()
    assert other.others == {row_key("c"): 3}


@pytest.mark.parametrize("claim", ["nul\0in-it", "é-ünïcode", "x" * 300], ids=["nul", "unicode", "long"])
def test_any_rules_file_claim_id_is_published_and_breaks_no_tick(node: Node, claim: str) -> None:
    """A rules file's claim id is any string; PostgreSQL's text takes no NUL: the rows hold its hex."""
    a, b = node("a"), node("b")
    assert a.acquire([(f"connections\0{claim}", 4), ("connections\0plain", 4)]) == -1
    a.sync()
    b.sync()
    assert b.others == {row_key(claim): 1, row_key("plain"): 1}
    assert a.take(f"rate\0{claim}", 1.0, 2, time.monotonic()) == 0.0


def test_a_stopped_node_deletes_its_rows(store: PostgresStore, node: Node) -> None:
    a, b = node("a"), node("b")
    a.acquire([("connections\0c", 4)])
    a.sync()
    a.stop()
    b.sync()
    assert b.others == {}


def test_a_refused_lease_is_remembered_until_its_tokens_are_back(store: PostgresStore, node: Node) -> None:
    """A claim hammering past its rate costs one database statement, not one per request."""
    a = node("a")
    calls = 0
    lease = a._lease

    def counted(*args: object) -> tuple[int, float]:
        nonlocal calls
        calls += 1
        return lease(*args)  # type: ignore[arg-type]

    a._lease = counted  # type: ignore[method-assign]
    b = node("b")
    b._lease("c", 0.5, 1, 1)  # another node spent the fleet's only token
    waits = [a.take("rate\0c", 0.5, 1, time.monotonic() + i * 0.001) for i in range(50)]
    assert all(w > 0 for w in waits[1:]) and calls == 1


def test_an_unreachable_database_keeps_the_others_counts_and_serves_a_share_of_the_rate(
    own_pg_cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    url = own_pg_cluster.database()
    keys = KeyRing.load_or_create(tmp_path / "k")
    with PostgresStore.open(url, keys) as sa, PostgresStore.open(url, keys) as sb:
        a = FleetCounters(SharedCounters.anonymous(), sa, "a", 0, "a", bound=1.0)
        b = FleetCounters(SharedCounters.anonymous(), sb, "b", 0, "b", bound=1.0)
        for _ in range(3):
            assert a.acquire([("connections\0c", 4)]) == -1
        a.sync()
        b.sync()
        assert b.take("rate\0r", 10.0, 4, time.monotonic()) == 0.0  # the fleet's bucket works
        own_pg_cluster.stop()
        time.sleep(1.5)  # past the heartbeat bound: A's rows would be stale, were they readable
        with pytest.raises(Exception):  # noqa: B017  StoreError: nothing answers
            b.sync()
        assert b.others == {row_key("c"): 3}, "the other node's count is kept while the read fails"
        assert b.acquire([("connections\0c", 4)]) == -1
        assert b.acquire([("connections\0c", 4)]) == 0
        b.alive = 2
        held = b._tokens[row_key("r")]  # leased before the outage: spent, as the tolerance allows
        now = time.monotonic()
        admitted = sum(b.take("rate\0r", 10.0, 4, now + i * 0.001) == 0.0 for i in range(40))
        assert admitted == held + 2, "the leased tokens, then the node's share of the burst (4 // 2)"
        a.stop()
        b.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(own_pg_cluster.url_params(), connect_timeout=2).close()
