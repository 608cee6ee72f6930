"""When the rules watcher judges a changed file stable enough to apply (addons/reload.py)."""

from __future__ import annotations

import pytest

from addons.reload import settled

NOW = 1_000_000.0  # wall clock, seconds


@pytest.mark.parametrize(
    ("mtime_age", "watched_for", "expected"),
    [
        pytest.param(0.1, 0.1, False, id="just-written"),
        pytest.param(2.9, 2.9, False, id="just-under-the-settle-time"),
        pytest.param(3.0, 0.0, True, id="mtime-old-enough-first-look"),  # an old file renamed in
        pytest.param(0.5, 3.0, True, id="watched-long-enough"),
        pytest.param(-60.0, 1.0, False, id="mtime-in-the-future-not-yet"),
        pytest.param(-60.0, 3.0, True, id="mtime-in-the-future-watched-long-enough"),
    ],
)
def test_settled(mtime_age: float, watched_for: float, expected: bool) -> None:
    stamp = (1, int((NOW - mtime_age) * 1e9), 10)
    assert settled(stamp, seen_at=100.0, now_wall=NOW, now_mono=100.0 + watched_for, settle=3.0) is expected
