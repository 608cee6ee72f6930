"""proxy.cli.options: the argument types the commands share accept their documented forms and
refuse the rest with a sentence naming the expected form (argparse prints it, exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import options


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (options.listen, "127.0.0.1:8080", ("127.0.0.1", 8080)),
        (options.listen, "[::1]:9", ("::1", 9)),
        (options.listen, ":8080", ("127.0.0.1", 8080)),
        (options.positive, "3", 3),
        (options.seconds, "86400", 86400),
        (options.resolve, "API.Example.com:127.0.0.1", ("api.example.com", "127.0.0.1")),
        (options.resolve, "api.test:[::1]", ("api.test", "::1")),
    ],
    ids=["listen", "listen-v6", "listen-no-host", "positive", "seconds-max", "resolve", "resolve-v6"],
)
def test_accepted_forms(parse: Callable[[str], Any], text: str, value: object) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (options.listen, "8080", "HOST:PORT"),
        (options.listen, "h:0", "HOST:PORT"),
        (options.listen, "h:65536", "HOST:PORT"),
        (options.positive, "0", "positive whole number"),
        (options.positive, "-1", "positive whole number"),
        (options.seconds, "86401", "1..86400"),
        (options.seconds, "١", "1..86400"),  # a non-ASCII digit
        (options.resolve, "api.test", "NAME:ADDR"),
        (options.resolve, "api.test:not-an-ip", "NAME:ADDR"),
    ],
    ids=[
        "no-port",
        "port-0",
        "port-too-big",
        "zero",
        "negative",
        "too-long",
        "arabic-digit",
        "no-addr",
        "bad-addr",
    ],
)
def test_refused_forms_name_the_expected_one(parse: Callable[[str], Any], text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse(text)


def test_the_state_dir_defaults_to_the_environment_then_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SURROGATE_STATE_DIR", str(tmp_path))
    assert options.default_state_dir() == tmp_path
    monkeypatch.delenv("SURROGATE_STATE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert options.default_state_dir() == tmp_path / "home" / ".local" / "state" / "surrogate"
