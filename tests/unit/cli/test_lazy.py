"""Client commands build the parser and run without the engine (issue 19): a subprocess runs
one and reports which heavy modules it imported; the parser-time copies in proxy.cli.options
stay equal to their sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from proxy.cli import options
from proxy.cli.main import _parser

HEAVY = ("mitmproxy", "fastapi", "proxy.rules.loader", "proxy.core.suffixes", "proxy.engine.master")
PROBE = """
import contextlib, io, json, sys
import proxy.cli.main as m
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = m.main(sys.argv[1:])
    except SystemExit as e:
        code = e.code
print(json.dumps({"code": code, "loaded": [n for n in %r if n in sys.modules]}))
""" % (HEAVY,)  # noqa: UP031


def _probe(*argv: str, state_dir: str) -> dict[str, object]:
    env = dict(os.environ, SURROGATE_STATE_DIR=state_dir)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("claims", "list", "--help"),
        ("claims", "list"),
        ("creds", "list"),
        ("approvals", "list"),
        ("creds", "put", "--help"),
        ("placeholder", "templates"),
        ("transparent-rules", "--port", "8081", "--interface", "veth0"),
        ("rules", "check", "--help"),
        ("audit", "verify", "--help"),
    ],
)
def test_client_command_imports_no_engine(argv: tuple[str, ...], tmp_path: object) -> None:
    result = _probe(*argv, state_dir=str(tmp_path))
    assert result["loaded"] == [], result


def test_help_lists_every_command() -> None:
    text = _parser().format_help()
    for name in ("run", "control", "claims", "creds", "approvals", "env", "transparent-rules", "keys",
                 "ca", "rules", "audit", "placeholder", "demo"):  # fmt: skip
        assert name in text, name


def test_parser_time_copies_match_their_sources() -> None:
    from certs import ca
    from proxy.cli import explain
    from proxy.engine import workers

    assert options.BUNDLE_FORMATS == ca.BUNDLE_FORMATS
    assert options.cores() == workers.default_count()
    assert explain.EXIT_HELP == options.EXPLAIN_EXIT_HELP
