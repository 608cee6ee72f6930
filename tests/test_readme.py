"""The README's examples hold what the code writes (issue 18 item 9: its audit line had lost six
fields, its command table the ``--state-dir`` of the commands that read the state dir).

- The audit line the README shows is a request event that docs/audit-schema.json accepts, with
  every field the schema names (the schema refuses unknown fields and requires each one), so a
  field added to the event fails here until the README shows it.
- Each command of the table that takes ``--state-dir`` lists it in its row.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from proxy.cli.main import _parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SCHEMA = json.loads((ROOT / "docs" / "audit-schema.json").read_text(encoding="utf-8"))


def _audit_example() -> dict[str, object]:
    block = re.search(r"shows one audit line per request:\n\n```json\n(.+?)\n```", README, re.S)
    assert block, "the README's audit example (a ```json block after 'shows one audit line per request:')"
    event = json.loads(block[1])
    assert isinstance(event, dict)
    return event


def test_the_readme_audit_line_has_every_field_of_the_request_event() -> None:
    fields = set(SCHEMA["$defs"]["request"]["properties"])
    shown = set(_audit_example())
    assert not fields - shown, f"missing from the README's audit line: {sorted(fields - shown)}"
    assert not shown - fields, f"not in docs/audit-schema.json: {sorted(shown - fields)}"


def test_the_readme_audit_line_is_a_valid_request_event() -> None:
    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(_audit_example())]
    assert not errors, errors


def _commands() -> dict[str, argparse.ArgumentParser]:
    """'run', 'ca export', ... -> its parser (leaves of the command tree)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and name:
            found[name] = parser
        for action in subs:
            for sub, child in action.choices.items():
                walk(child, f"{name} {sub}".strip())

    walk(_parser(), "")
    return found


def _table_rows() -> dict[str, str]:
    """The first row of the README's command table for each command it names."""
    section = README.split("## Command line", 1)[1]
    table = re.search(r"^\|.*?(?=\n\n)", section, re.S | re.M)
    assert table, "the README's command table"
    rows: dict[str, str] = {}
    for line in table[0].splitlines():
        m = re.match(r"\| `surrogate ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", line)
        if m:
            rows.setdefault(m[1], line)
    return rows


def _row(command: str) -> str | None:
    """The row of ``command``, else the row of its group that lists it (``claims create … / `list```)."""
    rows = _table_rows()
    group, _, sub = command.partition(" ")
    listed = (r for k, r in rows.items() if k.split()[0] == group and f"/ `{sub}" in r)
    return rows.get(command) or next(listed, None)


TAKES_STATE_DIR = sorted(
    name for name, p in _commands().items() if any("--state-dir" in a.option_strings for a in p._actions)
)


@pytest.mark.parametrize("command", TAKES_STATE_DIR)
def test_a_command_row_lists_state_dir_when_the_command_takes_it(command: str) -> None:
    row = _row(command)
    if row is None:
        pytest.skip(f"`surrogate {command}` has no row in the README's command table")
    assert "--state-dir" in row, f"the README row of `surrogate {command}` does not list --state-dir: {row}"
