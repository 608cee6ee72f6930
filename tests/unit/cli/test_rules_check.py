"""``surrogate rules check`` as an operator runs it (proxy.cli.main): every problem of a file in
one run, each at file:line:column, warnings with the errors, then how many (issue 18 item 1)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from proxy.cli.main import main

RULES = Path(__file__).resolve().parents[2] / "rules"
LOCATED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<warning>warning: )?\S")


def stage(name: str, folder: Path) -> Path:
    """``tests/rules/<name>`` in ``folder`` with the token files its sources name."""
    shutil.copyfile(RULES / name, folder / name)
    for token in ("proxy-token", "github-token", "example-token"):
        (folder / token).write_text(f"{token}-value-0001\n")
    return folder / name


def test_rules_check_lists_every_problem_of_a_file_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = stage("bad-every-section.yaml", tmp_path)
    assert main(["rules", "check", str(rules)]) == 1
    err = capsys.readouterr().err.splitlines()
    *found, summary = err
    assert summary == f"{rules}: 24 errors, 3 warnings"
    matches = [LOCATED.match(line) for line in found]
    assert all(m is not None and m["file"] == str(rules) for m in matches), found
    assert sum(1 for m in matches if m and m["warning"]) == 3
    assert len(found) == 27
    lines = [int(m["line"]) for m in matches if m]
    assert lines == sorted(lines)  # in file order, warnings among the errors


def test_rules_check_of_several_files_reports_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = stage("bad-several-problems.yaml", tmp_path)
    good = stage("good-minimal.yaml", tmp_path)
    assert main(["rules", "check", str(bad), str(good)]) == 1
    out, err = capsys.readouterr()
    assert f"{good}: ok" in out
    assert f"{bad}: 5 errors, 0 warnings" in err.splitlines()
