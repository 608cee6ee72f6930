"""The sandbox's environment, built from what ``surrogate env`` prints and nothing else.

:func:`printed_env` runs ``surrogate env --format dotenv`` for a claim and returns its variables
(comment lines skipped); :func:`sandbox` adds only what any process needs to start (``PATH``, a
fresh ``HOME``, ``LANG``): no proxy, CA or client configuration of the machine reaches a client
run with it, so a client that works trusts the proxy through the printed variables alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import ROOT, ProxyProcess


def printed(proxy: ProxyProcess, claim: str, extra: dict[str, str] | None = None) -> str:
    """What ``surrogate env --format dotenv`` prints for ``claim`` of the running ``proxy``
    (``extra``: the environment ``env`` itself needs, e.g. an ``env:`` value source)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "env",
            "--rules",
            str(proxy.rules),
            "--claim",
            claim,
            "--state-dir",
            str(proxy.state_dir),
            "--proxy",
            f"127.0.0.1:{proxy.port}",
            "--format",
            "dotenv",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
        env={**os.environ, **(extra or {})},
    )
    return done.stdout


def printed_env(proxy: ProxyProcess, claim: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of :func:`printed` (its ``#`` comment lines skipped)."""
    text = printed(proxy, claim, extra)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return {k: v.removeprefix('"').removesuffix('"') for k, v in (line.split("=", 1) for line in lines)}


def sandbox(printed: dict[str, str], home: Path) -> dict[str, str]:
    """``printed`` plus PATH, HOME (``home``, created) and LANG: the whole environment of a client."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **printed}
