"""The pure core of proxy/ imports no mitmproxy: it is testable and reusable without the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = (
    "proxy.hosts, proxy.rules, proxy.placeholders, proxy.decide, proxy.substitute, "
    "proxy.secrets, proxy.policy, proxy.audit, proxy.paths, proxy.slots, proxy.spellings, "
    "proxy.scrub, proxy.base64run"
)


def test_pure_core_does_not_import_mitmproxy() -> None:
    code = (
        f"import {CORE}, sys; "
        "bad = sorted(m for m in sys.modules if m.startswith('mitmproxy')); "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
