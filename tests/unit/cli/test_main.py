"""proxy.cli.main: the parser of every command, as --help prints it (issue 18 item 9: the
top-level --help showed the module docstring's reStructuredText markup)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from proxy.cli.main import _parser
from proxy.cli.options import plain

# reStructuredText that must not reach a terminal: inline literals, roles, links, directives
MARKUP = re.compile(r"``|:[a-z]+(?::[a-z]+)?:`|`[^`\n]+`_|^\s*\.\. [a-z-]+::", re.M)


def _parsers(
    parser: argparse.ArgumentParser, name: str = "surrogate"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _parsers(child, f"{name} {sub}")


PARSERS = dict(_parsers(_parser()))


def test_every_command_is_walked() -> None:
    assert {
        "surrogate",
        "surrogate run",
        "surrogate creds put",
        "surrogate ca export",
        "surrogate audit why",
    } <= set(PARSERS)
    assert len(PARSERS) >= 29


@pytest.mark.parametrize("name", PARSERS)
def test_no_restructuredtext_markup_reaches_help(name: str) -> None:
    text = PARSERS[name].format_help()
    assert not MARKUP.search(text), f"{name} --help shows markup: {MARKUP.search(text)}"


def test_the_top_level_help_says_what_the_command_is() -> None:
    assert "The surrogate command line (also python -m proxy)." in PARSERS["surrogate"].format_help()


@pytest.mark.parametrize(
    ("rst", "text"),
    [
        ("The ``surrogate`` command", "The surrogate command"),
        (":mod:`proxy.cli.main` parses", "proxy.cli.main parses"),
        (":class:`~proxy.control.service.Control`", "proxy.control.service.Control"),
        (":py:func:`main`", "main"),
        ("no markup, a `single` backtick", "no markup, a `single` backtick"),
    ],
    ids=["literal", "role", "role-tilde", "domain-role", "plain"],
)
def test_plain_drops_roles_and_literals(rst: str, text: str) -> None:
    assert plain(rst) == text
    assert not MARKUP.search(plain(rst))
