"""proxy.engine.hardening: a hardened process has no core limit and is not dumpable (Linux).

Run in a child interpreter: hardening is one-way, and the test runner must stay debuggable."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import resource
from proxy.engine import hardening
before = hardening.dumpable()
problems = hardening.harden()
print(before, hardening.dumpable(), resource.getrlimit(resource.RLIMIT_CORE), problems)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_DUMPABLE) is Linux-only")
def test_harden_disables_core_dumps_and_the_dumpable_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.split(maxsplit=2)[:2] == ["True", "False"], done
    assert "(0, 0) []" in done.stdout, done
