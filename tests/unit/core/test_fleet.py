"""proxy.core.fleet: the arithmetic of fleet-wide limits (tables)."""

from __future__ import annotations

import pytest

from proxy.core import fleet


@pytest.mark.parametrize(
    ("limit", "others", "bound"),
    [(4, 0, 4), (4, 3, 1), (4, 4, 0), (4, 9, 0), (1, 0, 1), (4, -2, 4)],
    ids=["none-elsewhere", "three-elsewhere", "all-elsewhere", "more-elsewhere-than-the-limit",
         "limit-one", "a-negative-count-is-no-credit"],
)  # fmt: skip
def test_connection_bound(limit: int, others: int, bound: int) -> None:
    assert fleet.connection_bound(limit, others) == bound


@pytest.mark.parametrize(
    ("rate", "burst", "batch"),
    [(1.0, 1, 1), (1.0, 200, 1), (0.1, 5, 1), (4.0, 200, 1), (100.0, 200, 25), (100.0, 10, 10),
     (1000.0, 2000, 250), (7.9, 100, 1), (8.0, 100, 2)],
    ids=["rate-1-burst-1", "rate-1", "slower-than-1", "rate-4", "default", "burst-caps", "fast",
         "just-under-2", "exactly-2"],
)  # fmt: skip
def test_batch_is_a_quarter_second_at_least_one_never_past_the_burst(
    rate: float, burst: int, batch: int
) -> None:
    assert fleet.batch(rate, burst) == batch


@pytest.mark.parametrize(
    ("tokens", "stamp", "now", "rate", "burst", "want", "expected"),
    [
        (5.0, 0.0, 0.0, 1.0, 10, 3, (3, 2.0, 0.0)),
        (0.0, 0.0, 2.5, 1.0, 10, 3, (2, 0.5, 2.5)),
        (9.0, 0.0, 100.0, 1.0, 10, 3, (3, 7.0, 100.0)),  # refill stops at the burst
        (0.4, 0.0, 0.5, 1.0, 10, 3, (0, 0.9, 0.5)),  # nothing whole: nothing granted
        (3.0, 10.0, 5.0, 1.0, 10, 2, (2, 1.0, 10.0)),  # a clock behind the stamp refills nothing
        (20.0, 0.0, 0.0, 1.0, 4, 2, (2, 2.0, 0.0)),  # a lower burst (reload) caps what was saved
    ],
    ids=["spend", "refill", "capped", "fraction", "clock-behind", "lower-burst"],
)  # fmt: skip
def test_lease(tokens: float, stamp: float, now: float, rate: float, burst: int, want: int,
               expected: tuple[int, float, float]) -> None:  # fmt: skip
    granted, left, at = fleet.lease(tokens, stamp, now, rate, burst, want)
    assert (granted, at) == expected[::2]
    assert left == pytest.approx(expected[1])


@pytest.mark.parametrize(
    ("rate", "burst", "nodes", "share"),
    [(10.0, 20, 1, (10.0, 20)), (10.0, 20, 2, (5.0, 10)), (10.0, 1, 3, (10 / 3, 1)),
     (10.0, 20, 0, (10.0, 20))],
    ids=["alone", "two", "burst-at-least-one", "no-node-seen-is-one"],
)  # fmt: skip
def test_fallback_is_the_nodes_share(rate: float, burst: int, nodes: int, share: tuple[float, int]) -> None:
    assert fleet.fallback(rate, burst, nodes) == pytest.approx(share)


def test_tolerances() -> None:
    assert fleet.rate_tolerance(2, 100.0, 200) == 50
    assert fleet.rate_tolerance(2, 1.0, 1) == 2
    assert fleet.connection_tolerance(2, 4, 2) == 6
    assert fleet.connection_tolerance(9, 4, 2) == 8  # never more than every node's whole limit


def test_wait() -> None:
    assert fleet.wait(0.25, 2.0) == pytest.approx(0.375)
    assert fleet.wait(1.5, 2.0) == 0.0
