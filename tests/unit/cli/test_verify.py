"""``surrogate audit verify FILE...``: exit 0 intact, 1 broken (file, line, what was expected),
2 usage; rotated files are read oldest first whatever order the shell gives them in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy import audit
from proxy.cli.main import main
from proxy.cli.verify import chain_order


@pytest.fixture(autouse=True)
def _reset_audit() -> Iterator[None]:
    yield
    audit.configure(None)


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """A chain over audit.jsonl and more than ten rotated backups."""
    audit.configure(tmp_path / "audit.jsonl", max_bytes=600, backups=30)
    for i in range(60):
        audit.emit("request", {audit.REQUEST_ID: f"r{i}", audit.HOST: "api.test"})
    found = sorted(tmp_path.glob("audit.jsonl*"))  # the shell's order: .1, .10, .11, .2, ...
    assert len(found) > 11
    return found


def test_chain_order_puts_the_oldest_backup_first() -> None:
    given = [Path(p) for p in ["a.jsonl", "a.jsonl.1", "a.jsonl.10", "a.jsonl.2", "b.jsonl"]]
    ordered = ["a.jsonl.10", "a.jsonl.2", "a.jsonl.1", "a.jsonl", "b.jsonl"]
    assert [p.name for p in chain_order(given)] == ordered


def test_intact_files_exit_0_and_print_the_last_hash(
    files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "intact: 60 lines" in out and "sha256 " in out


def test_a_changed_line_exits_1_naming_file_line_and_hashes(
    files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target = chain_order(files)[3]
    lines = target.read_text().splitlines()
    lines[1] = lines[1].replace("api.test", "evil.test")
    target.write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert f"{target}:2: broken: changed" in out
    assert "expected: " in out and "found: " in out


def test_a_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_no_file_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        main(["audit", "verify"])
    assert e.value.code == 2
