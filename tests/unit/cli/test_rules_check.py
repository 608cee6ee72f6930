"""``surrogate rules check`` as an operator runs it (proxy.cli.main): every problem of a file in
one run, each at file:line:column, warnings with the errors, then how many (issue 18 item 1)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from proxy.cli.main import main
from proxy.core import placeholders, templates
from proxy.core.errors import RulesError
from proxy.rules.loader import load_rules

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


# --- value sources are read only when asked (issue 18 item 11) --------------------------------

EXAMPLE = Path(__file__).resolve().parents[3] / "rules" / "example.yaml"


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    """rules/example.yaml as a fresh clone holds it: no ``.state`` beside ``rules/`` yet, so its
    ``file:../.state/demo-*-token`` sources cannot be read."""
    (tmp_path / "rules").mkdir()
    rules = tmp_path / "rules" / "example.yaml"
    shutil.copyfile(EXAMPLE, rules)
    return rules


SOURCE_PROBLEMS = [(31, "claims[0].proxy_token"), (35, "claims[0].credentials[0].value")]


def located(err: str) -> list[tuple[int, str]]:
    out = []
    for line in err.splitlines():
        m = re.match(r"^(?:surrogate: )?[^:]+:(\d+):\d+: (\S+): cannot read file:", line)
        if m:
            out.append((int(m[1]), m[2]))
    return out


def test_rules_check_validates_without_reading_any_secret(
    fresh_clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rules", "check", str(fresh_clone)]) == 0
    assert capsys.readouterr().out == f"{fresh_clone}: ok\n"


def test_rules_check_with_check_sources_reports_each_unreadable_source_where_it_is(
    fresh_clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rules", "check", "--check-sources", str(fresh_clone)]) == 1
    err = capsys.readouterr().err
    assert located(err) == SOURCE_PROBLEMS
    assert "demo-proxy-token: No such file or directory" in err
    assert err.splitlines()[-1] == f"{fresh_clone}: 2 errors, 0 warnings"


def test_rules_check_sources_pass_once_readable(fresh_clone: Path) -> None:
    state = fresh_clone.parent.parent / ".state"
    state.mkdir()
    (state / "demo-proxy-token").write_text("proxy-token-value-0001\n")
    (state / "demo-github-token").write_text("github-token-value-0002\n")
    assert main(["rules", "check", "--check-sources", str(fresh_clone)]) == 0


def test_an_unset_env_source_is_a_problem_only_when_sources_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SURROGATE_TEST_UNSET_TOKEN", raising=False)
    rules = tmp_path / "r.yaml"
    claim = "{id: c, pool: p, proxy_token: 'env:SURROGATE_TEST_UNSET_TOKEN'}"
    rules.write_text(f"version: 1\npools: {{p: {{}}}}\nclaims:\n  - {claim}\n")
    assert main(["rules", "check", str(rules)]) == 0
    capsys.readouterr()
    assert main(["rules", "check", "--check-sources", str(rules)]) == 1
    assert f"{rules}:4:" in capsys.readouterr().err
    # the form of a source is always checked: a literal value is refused without reading anything
    rules.write_text("version: 1\npools: {p: {}}\nclaims:\n  - {id: c, pool: p, proxy_token: hunter2}\n")
    assert main(["rules", "check", str(rules)]) == 1
    err = capsys.readouterr().err
    assert "claims[0].proxy_token: must be 'env:NAME' or 'file:PATH'" in err and "hunter2" not in err


def test_rules_explain_needs_no_secret_and_checks_sources_when_asked(
    fresh_clone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = ["--claim", "demo", "GET", "https://api.github.com/user"]
    assert main(["rules", "explain", "--rules", str(fresh_clone), *request]) == 0
    assert "verdict: allow" in capsys.readouterr().out
    assert main(["rules", "explain", "--rules", str(fresh_clone), "--check-sources", *request]) == 1
    assert located(capsys.readouterr().err) == SOURCE_PROBLEMS


def test_loading_for_run_still_reads_every_source(fresh_clone: Path) -> None:
    """What ``run`` (and a reload) loads: the default reads the sources and refuses the file."""
    with pytest.raises(RulesError) as info:
        load_rules(fresh_clone)
    assert [(p.line, p.field) for p in info.value.problems] == SOURCE_PROBLEMS


def test_rules_check_shows_each_template_placeholder_and_the_cli_mints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["placeholder", "mint", "github_classic"]) == 0
    ph = capsys.readouterr().out.strip()
    assert placeholders.template_of(ph) is templates.SHIPPED["github_classic"]
    assert placeholders.has_valid_checksum(ph)
    (tmp_path / "tok").write_text("t\n")
    (tmp_path / "s").write_text("CANARYcheck-template-01\n")
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "version: 1\npools:\n  p:\n    egress:\n      - host: api.github.com\n"
        "claims:\n  - id: c\n    pool: p\n    proxy_token: file:tok\n    credentials:\n"
        f"      - name: gh\n        value: file:s\n        placeholder: {ph}\n"
        "        placeholder_template: github_classic\n        hosts: [api.github.com]\n"
    )
    assert main(["rules", "check", str(rules)]) == 0
    out = capsys.readouterr().out
    assert "credential gh: placeholder template github_classic (ghp_ + 36 of [A-Za-z0-9])" in out
    assert ph not in out
    assert main(["placeholder", "templates"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":", 1)[0] for line in listed] == list(templates.SHIPPED)
