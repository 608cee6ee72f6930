"""The suite's scope order (tests/schedule.py): longest first, by measured seconds, else estimated."""

from __future__ import annotations

from pathlib import Path

import schedule


def _ids(module: str, n: int) -> list[str]:
    return [f"{module}::test_{i}" for i in range(n)]


def test_a_measured_slow_module_of_few_tests_goes_before_a_module_of_many_fast_ones() -> None:
    """xdist's own order is by test count: 4 browser tests would go after 600 unit tests, last."""
    scopes = {"tests/unit/core/test_a.py": _ids("tests/unit/core/test_a.py", 600),
              "tests/e2e/test_browser.py": _ids("tests/e2e/test_browser.py", 4)}  # fmt: skip
    assert schedule.order(scopes, {"tests/e2e/test_browser.py": 90.0}) == [
        "tests/e2e/test_browser.py", "tests/unit/core/test_a.py"]  # fmt: skip


def test_unmeasured_modules_are_estimated_by_tier_and_a_scope_sums_its_modules() -> None:
    scopes = {
        "tests/unit/test_many.py": _ids("tests/unit/test_many.py", 1000),  # 20 s estimated
        "netns": _ids("tests/e2e/test_f.py", 20) + _ids("tests/e2e/test_g.py", 20),  # 40 s
        "tests/adversarial/test_x.py": _ids("tests/adversarial/test_x.py", 10),  # 7 s
        "tests/e2e/test_y.py": _ids("tests/e2e/test_y.py", 30),  # 30 s estimated, 1 s measured
    }
    got = schedule.order(scopes, {"tests/e2e/test_y.py": 1.0})
    assert got == ["netns", "tests/unit/test_many.py", "tests/adversarial/test_x.py", "tests/e2e/test_y.py"]


def test_ties_keep_the_collection_order() -> None:
    scopes = {m: _ids(m, 3) for m in ("tests/e2e/test_b.py", "tests/e2e/test_a.py")}
    assert schedule.order(scopes, {}) == ["tests/e2e/test_b.py", "tests/e2e/test_a.py"]


def test_the_table_merges_a_partial_run_and_a_broken_table_reads_as_empty(tmp_path: Path) -> None:
    table = tmp_path / "durations.json"
    schedule.write_table({"tests/e2e/test_a.py": 12.34, "tests/e2e/test_b.py": 1.0}, table)
    schedule.write_table({"tests/e2e/test_b.py": 2.0}, table)
    assert schedule.read_table(table) == {"tests/e2e/test_a.py": 12.3, "tests/e2e/test_b.py": 2.0}
    table.write_text("[not a table")
    assert schedule.read_table(table) == {}


def test_the_committed_table_names_only_modules_that_exist() -> None:
    root = Path(__file__).parent.parent
    stale = [m for m in schedule.read_table() if not (root / m).is_file()]
    assert not stale, f"tests/durations.json names modules that are gone: {stale}"
