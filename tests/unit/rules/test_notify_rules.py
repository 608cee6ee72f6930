"""The rules file's top-level ``approvals`` (issue 16): the notification command read into
:class:`proxy.core.approvals.Notify`, every wrong field reported at its file, line and field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxy.core.approvals import Notify
from proxy.core.errors import RulesError
from proxy.rules.loader import load_rules


def _load(tmp_path: Path, approvals: str) -> Path:
    tool = tmp_path / "page-ops"
    tool.write_text("#!/bin/sh\ncat >/dev/null\n")
    tool.chmod(0o755)
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    path = tmp_path / "r.yaml"
    path.write_text(
        f"version: 1\npools:\n  p:\n    egress:\n      - host: api.test\napprovals: {approvals}\n"
    )
    return path


def test_the_notify_command_is_read_relative_to_the_rules_file(tmp_path: Path) -> None:
    policy = load_rules(_load(tmp_path, "{notify: [./page-ops, --channel, ops], timeout: 2.5}"))
    assert policy.notify == Notify((str(tmp_path / "page-ops"), "--channel", "ops"), 2.5)
    assert load_rules(_load(tmp_path, "{notify: [./page-ops]}")).notify == Notify(
        (str(tmp_path / "page-ops"),), 5.0
    )


def test_no_approvals_section_notifies_nobody(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n")
    assert load_rules(path).notify is None


@pytest.mark.parametrize(
    ("approvals", "field", "said"),
    [
        ("{notify: []}", "approvals.notify", "non-empty list"),
        ("{notify: ['']}", "approvals.notify", "non-empty list"),
        ("{notify: [./missing]}", "approvals.notify[0]", "not an executable file"),
        ("{notify: [./not-executable]}", "approvals.notify[0]", "not an executable file"),
        ("{notify: [./page-ops], timeout: 0}", "approvals.timeout", "more than 0"),
        ("{notify: [./page-ops], timeout: 61}", "approvals.timeout", "at most 60"),
        ("{notify: [./page-ops], timeout: -1}", "approvals.timeout", "more than 0"),
        ("{notify: ./page-ops}", "approvals.notify", ""),  # a string, not an argv list
        ("{notify: [./page-ops], shell: true}", "approvals.shell", ""),  # unknown key
        ("{timeout: 5}", "approvals.notify", ""),  # required
        ("yes", "approvals", ""),
    ],
    ids=["empty", "empty-program", "missing", "not-executable", "timeout-0", "timeout-61", "timeout-negative",
         "string", "unknown-key", "no-notify", "not-a-mapping"],
)  # fmt: skip
def test_a_wrong_approvals_field_is_reported_where_it_is(
    tmp_path: Path, approvals: str, field: str, said: str
) -> None:
    with pytest.raises(RulesError) as info:
        load_rules(_load(tmp_path, approvals))
    found = [p for p in info.value.problems if p.field == field]
    assert len(found) == 1, info.value.problems  # said once, where it is
    assert said in found[0].message
    assert found[0].line == 6 and str(found[0]).startswith(f"{tmp_path / 'r.yaml'}:6:")
    assert os.fspath(tmp_path / "r.yaml") == found[0].file
