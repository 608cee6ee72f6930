"""proxy.core.limits: token buckets, per-claim connection counts and request-head deadlines, with a
clock passed in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.limits import ClaimLimiter, HeadDeadlines, Limits, TokenBucket, retry_after
from proxy.store.counters import SharedCounters


@pytest.mark.parametrize(
    ("rate", "burst", "times", "expected"),
    [
        (1.0, 2, [0, 0, 0], [0.0, 0.0, 1.0]),
        (2.0, 1, [0, 0, 0.5, 0.5], [0.0, 0.5, 0.0, 0.5]),
        (10.0, 3, [0, 0, 0, 0, 0.1], [0.0, 0.0, 0.0, 0.1, 0.0]),
        (0.5, 1, [0, 1, 2], [0.0, 1.0, 0.0]),
        (1.0, 1, [5, 4, 5], [0.0, 1.0, 1.0]),  # a clock that steps back refills nothing
    ],
    ids=["burst-then-wait", "half-second-refill", "burst-3-rate-10", "slow-rate", "clock-backwards"],
)
def test_token_bucket(rate: float, burst: int, times: list[float], expected: list[float]) -> None:
    bucket = TokenBucket(rate, burst, float(burst), times[0])
    got = [round(bucket.take(t), 6) for t in times]
    assert got == expected


@pytest.mark.parametrize(
    ("wait", "header"),
    [(0.001, 1), (0.999, 1), (1.0, 1), (1.01, 2), (30.2, 31)],
    ids=["tiny", "under-one", "one", "just-over-one", "long"],
)
def test_retry_after_is_whole_seconds_never_zero(wait: float, header: int) -> None:
    assert retry_after(wait) == header


@given(
    rate=st.floats(0.1, 1000),
    burst=st.integers(1, 500),
    steps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_never_more_than_burst_plus_rate_times_elapsed(rate: float, burst: int, steps: list[float]) -> None:
    bucket = TokenBucket(rate, burst, float(burst), 0.0)
    now, allowed = 0.0, 0
    for step in steps:
        now += step
        allowed += bucket.take(now) == 0.0
    assert allowed <= burst + rate * now + 1e-6


def test_connection_limit_counts_per_claim_and_frees_on_close() -> None:
    lim, limits = ClaimLimiter(SharedCounters.anonymous()), Limits(connections=2)
    assert lim.open("c1", "a", limits)
    assert lim.open("c1", "a", limits)  # the same connection is counted once
    assert lim.open("c2", "a", limits)
    assert not lim.open("c3", "a", limits)
    assert lim.open("c3", "b", limits)  # another claim has its own count
    lim.close("c1")
    assert lim.open("c3", "a", limits)
    lim.close("c2")
    lim.close("c3")
    lim.close("unknown")
    assert lim.connections("a") == lim.connections("b") == 0 and lim.owner == {}


def test_rate_is_per_claim_and_follows_reloaded_limits() -> None:
    lim = ClaimLimiter(SharedCounters.anonymous())
    tight = Limits(rate=1.0, burst=1)
    assert lim.take("a", tight, 0.0) == 0.0
    assert lim.take("a", tight, 0.0) == 1.0
    assert lim.take("b", tight, 0.0) == 0.0
    loose = Limits(rate=100.0, burst=5)
    assert lim.take("a", loose, 0.5) == 0.0  # 0.5 s at the new rate refilled the bucket


def test_quiet_buckets_give_their_slots_back() -> None:
    """A full bucket holds nothing worth keeping: 5,000 claims fit a 4,096-slot table in turn."""
    lim = ClaimLimiter(SharedCounters.anonymous())
    limits = Limits(rate=1000.0, burst=1)
    for i in range(5000):
        assert lim.take(f"claim-{i}", limits, 1.0 + i) == 0.0


@pytest.mark.parametrize(
    ("events", "overdue_at_10"),
    [
        ([("wait", 0)], ["c"]),
        ([("wait", 0), ("head", 1)], []),
        ([("wait", 0), ("head", 1), ("finished", 2)], []),
        ([("wait", 0), ("head", 1), ("finished", -5)], ["c"]),
        ([("wait", 0), ("head", 1), ("head", 1), ("finished", -5)], []),  # HTTP/2: one still in flight
        ([("wait", 0), ("exempt", 1)], []),
        ([("wait", 0), ("exempt", 1), ("head", 2), ("finished", -5)], []),
        ([("wait", 0), ("close", 1)], []),
    ],
    ids=[
        "opened-never-sent",
        "head-arrived",
        "answered-recently",
        "idle-since-last-response",
        "h2-stream-in-flight",
        "opaque-tunnel",
        "websocket-after-upgrade",
        "closed",
    ],
)
def test_head_deadlines(events: list[tuple[str, float]], overdue_at_10: list[str]) -> None:
    heads = HeadDeadlines()
    for what, t in events:
        if what == "wait":
            heads.wait("c", t)
        elif what == "head":
            heads.head("c")
        elif what == "finished":
            heads.finished("c", t)
        elif what == "exempt":
            heads.exempt("c")
        else:
            heads.close("c")
    assert heads.overdue(10.0, 9.0) == overdue_at_10
