"""Session-wide: the canary scan over every artifact the suite wrote (DESIGN.md invariant 1).

Every secret value a test handed to a proxy came from :mod:`canary`. When the session ends, every
file under pytest's basetemp (audit logs, stores and their -wal/-shm, stderr captures, CA dirs,
git clones, client outputs) is scanned for each of them in raw, base64, percent and JSON-escaped
forms; only the files registered as a secret's source are skipped. A hit fails the session.
"""

from __future__ import annotations

from pathlib import Path

import canary
import pytest
from pg import pg_cluster  # noqa: F401  (the session's private PostgreSQL: tests/pg.py)


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin may clean basetemp up
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp: Path | None = getattr(factory, "_basetemp", None)  # None: no test used a temp dir
    if basetemp is None or not canary.values():
        return
    hits = canary.scan_tree(basetemp, canary.values(), canary.exempted())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "canary scan", red=bool(hits), green=not hits)
        reporter.write_line(
            f"{len(canary.values())} canary secrets, {len(canary.exempted())} source files exempted, "
            f"every file under {basetemp} scanned: {len(hits)} found"
        )
        for hit in hits:
            reporter.write_line(f"  LEAK {hit}", red=True)
    if hits:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
