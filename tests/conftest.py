"""Session-wide: the canary scan over every artifact the suite wrote (DESIGN.md invariant 1).

Every secret value a test handed to a proxy came from :mod:`canary`. When the session ends, every
file under pytest's basetemp (audit logs, stores and their -wal/-shm, stderr captures, CA dirs,
git clones, client outputs) is scanned for each of them in raw, base64, percent and JSON-escaped
forms; only the files registered as a secret's source are skipped. A hit fails the session.

Under pytest-xdist (``make test`` runs ``-n 2``) the canaries live in the worker that made them:
each worker scans its own basetemp (``<basetemp>/popen-gwN``, where every file its tests wrote
is) and sends what it found to the controller in ``workeroutput``; the controller prints every
worker's line and fails the session on a hit, or when a worker ended without sending its scan
(crashed: fail closed). A module's tests run in one worker, in order; the modules that make
network namespaces run in one worker (``pytest_xdist_make_scheduler``): their sysctls, bridges and
fixed address ranges are not shared. The scopes are handed out longest first, by each module's
measured seconds (tests/schedule.py): the last ones are short, so both workers finish together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import canary
import pytest
import schedule
import unixconnect
from pg import pg_cluster  # noqa: F401  (the session's private PostgreSQL: tests/pg.py)

pytest_plugins = ["pytester"]  # tests/test_canary.py runs an inner session under xdist
unixconnect.install()  # a failed connect to a control socket closes its socket (tests/unixconnect.py)
_worker_scans: dict[str, dict[str, Any] | None] = {}  # the controller's: worker id -> its scan
_module_seconds: dict[str, float] = {}  # the controller's: module -> seconds of its tests this run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true", default=False,
                     help="merge this run's seconds per module into tests/durations.json (the "
                          "scheduler's order on a clean clone; tests/schedule.py)")  # fmt: skip


def _known_seconds(config: pytest.Config) -> dict[str, float]:
    """Module -> seconds: the committed table, overridden by this machine's last runs."""
    cache = getattr(config, "cache", None)  # None under -p no:cacheprovider
    cached = cache.get(schedule.CACHE_KEY, {}) if cache is not None else {}
    return schedule.read_table() | (cached if isinstance(cached, dict) else {})


_netns_module: dict[str, bool] = {}


def _scope(rootpath: Path, nodeid: str) -> str:
    """The unit an xdist worker takes whole: the test's module, or ``netns`` for every module that
    makes network namespaces (its source says ``netns``: tests/e2e/_netns.py's and
    test_transparent.py's own, in the root namespace), so those run in one worker, in turn."""
    module = nodeid.split("::", 1)[0]
    if module not in _netns_module:
        path = rootpath / module
        _netns_module[module] = path.suffix == ".py" and "netns" in path.read_text(errors="replace")
    return "netns" if _netns_module[module] else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each module's tests run in one worker, in order (a module's ``test_zz_*`` tests read what
    its module-scoped proxy counted), and the namespace modules in one worker. A scheduler rather
    than ``xdist_group`` marks: with pytest 9.2 and xdist 3.8 ``--dist loadgroup`` split a marked
    module across workers here (tried on a two-module example), while a scope scheduler does not."""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope(config.rootpath, nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # the queue is whole before its first unit goes out: order it longest first, once
            if not self.ordered:
                self.ordered = True
                keys = schedule.order(self.workqueue, _known_seconds(config))
                self.workqueue = OrderedDict((k, self.workqueue[k]) for k in keys)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """(controller, or a run without xdist) Add each phase's seconds to its module's."""
    module = schedule.module_of(report.nodeid)
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def _store_seconds(session: pytest.Session) -> None:
    """Keep this run's module seconds for the next run's order (a run that selected only some of a
    module's tests, or stopped early, measured less than the module takes: not kept)."""
    option = session.config.option
    some_tests = any("::" in arg for arg in session.config.args)  # node ids: part of a module
    if not _module_seconds or some_tests or option.keyword or option.markexpr or session.shouldstop \
            or session.shouldfail or getattr(option, "lf", False):  # fmt: skip
        return
    cache = getattr(session.config, "cache", None)
    if cache is not None:
        cached = cache.get(schedule.CACHE_KEY, {})
        cache.set(schedule.CACHE_KEY, (cached if isinstance(cached, dict) else {}) | _module_seconds)
    if session.config.getoption("store_durations"):
        schedule.write_table(_module_seconds)


def _scan(session: pytest.Session) -> dict[str, Any] | None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp: Path | None = getattr(factory, "_basetemp", None)  # None: no test used a temp dir
    if basetemp is None or not canary.values():
        return None
    hits = canary.scan_tree(basetemp, canary.values(), canary.exempted())
    return {"values": len(canary.values()), "exempted": len(canary.exempted()),
            "root": str(basetemp), "hits": hits}  # fmt: skip


def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist controller) A worker ended: keep its scan, None when it sent none."""
    output = getattr(node, "workeroutput", None) or {}
    _worker_scans[str(node.gateway.id)] = output.get("canary_scan", {"missing": True})


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin may clean basetemp up
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports and fails
        workeroutput["canary_scan"] = _scan(session)
        return
    _store_seconds(session)
    scans = dict(_worker_scans) if _worker_scans else {"": _scan(session)}
    lines: list[tuple[str, bool]] = []
    failed = False
    for worker, scan in sorted(scans.items()):
        who = f"[{worker}] " if worker else ""
        if scan is None:
            continue  # no canary made, or no temp dir used: nothing to scan
        if scan.get("missing"):
            lines.append((f"{who}ended without its canary scan: the session fails closed", True))
            failed = True
            continue
        hits = scan["hits"]
        lines.append((
            f"{who}{scan['values']} canary secrets, {scan['exempted']} source files exempted, "
            f"every file under {scan['root']} scanned: {len(hits)} found", bool(hits),
        ))  # fmt: skip
        lines += [(f"  LEAK {hit}", True) for hit in hits]
        failed = failed or bool(hits)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and lines:
        reporter.write_sep("=", "canary scan", red=failed, green=not failed)
        for text, red in lines:
            reporter.write_line(text, red=red)
    if failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
