"""The layers of ``proxy/`` (issue 17): each imports only the layers under it, nothing in
``proxy/`` imports in a circle, and the core is pure.

Imports are read from the source (every ``import`` and ``from ... import``, at module level or
inside a function, ``TYPE_CHECKING`` blocks included), so a late import inside a function cannot
hide an upward edge. The purity of the core is checked twice: statically (what its modules name)
and at run time (what importing all of them loads into ``sys.modules``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy"

# The layer of every part of proxy/ (a package, or a top-level module); lower imports nothing
# higher. Parts on one layer do not import each other either (rules and store are independent),
# except the engine and the addons: the engine embeds the chain, the addons read its state.
LAYERS = {
    "proxy.core": 0,
    "proxy.audit": 1,
    "proxy.metrics": 1,
    "proxy.rules": 1,
    "proxy.store": 1,
    "proxy.control": 2,
    "proxy.engine": 3,
    "addons": 3,
    "proxy.cli": 4,
}
# proxy/__init__.py and proxy/_moved.py (the old flat paths) sit outside the layers: they import
# nothing of the project at module level, and nothing imports them except by package import.
OUTSIDE = {"proxy", "proxy._moved", "proxy.__main__"}
PEERS = {frozenset({"proxy.engine", "addons"})}

# What the core may import besides the standard library modules below: parsers and data only.
CORE_LIBRARIES = {
    "h11", "idna", "ahocorasick_rs", "publicsuffixlist", "confusable_homoglyphs", "http_sf",  # parsers, data
    "brotli", "compression", "backports",  # codecs of bodies (zstd: compression.zstd, backports.zstd)
}  # fmt: skip
# Standard library modules that mean I/O, a clock, processes, threads or the network.
CORE_FORBIDDEN = {
    "asyncio", "fcntl", "mmap", "os", "pathlib", "select", "selectors", "shutil", "signal",
    "socket", "sqlite3", "ssl", "subprocess", "tempfile", "threading", "time", "datetime",
    "multiprocessing", "concurrent", "logging", "io", "sys",
}  # fmt: skip
THIRD_PARTY_ELSEWHERE = {
    "mitmproxy", "structlog", "prometheus_client", "psutil", "cryptography", "httpx", "fastapi",
    "uvicorn", "pydantic", "yaml", "psycopg", "starlette",
}  # fmt: skip


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("proxy", "addons"):
        for path in sorted((ROOT / top).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from X import Y`` gives X.Y when X.Y is a
    module of the project, else X)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                names.add(sub if sub in MODULES else node.module)
    return names


def _part(module: str) -> str | None:
    """The layered part ``module`` belongs to (``proxy.store.sqlite`` → ``proxy.store``)."""
    for part in sorted(LAYERS, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return None


def _project_edges() -> dict[str, set[str]]:
    """module → the project modules it imports (a package import counts as its ``__init__``)."""
    return {m: {i for i in _imports(p) if i in MODULES} for m, p in MODULES.items()}


def test_every_module_of_proxy_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if _part(m) is None and m not in OUTSIDE)
    assert not unplaced, f"modules outside every layer (add them to a package): {unplaced}"


def test_layers_import_only_downward() -> None:
    upward = []
    for module, targets in _project_edges().items():
        here = _part(module)
        if here is None:
            continue
        for target in targets:
            there = _part(target)
            if target in OUTSIDE or there is None or there == here or {here, there} in PEERS:
                continue
            if LAYERS[there] >= LAYERS[here]:
                upward.append(f"{module} (layer {LAYERS[here]}) imports {target} (layer {LAYERS[there]})")
    assert not upward, "\n".join(sorted(upward))


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_nothing_in_proxy_imports_in_a_circle() -> None:
    edges = _project_edges()
    # A package's __init__ that forwards old names imports nothing at module level; the edge from
    # a module to its own package's __init__ (Python runs it first) is not an import of ours.
    assert not _cycles(edges), _cycles(edges)


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_upward_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from proxy.store.sqlite import Store\n    return Store\n")
    assert "proxy.store.sqlite" in _imports(src)


CORE = sorted(m for m in MODULES if _part(m) == "proxy.core")


@pytest.mark.parametrize("module", CORE)
def test_a_core_module_names_no_io_clock_or_engine(module: str) -> None:
    bad = []
    for name in _imports(MODULES[module]):
        top = name.split(".")[0]
        if top in ("proxy", "addons"):
            if not name.startswith("proxy.core"):
                bad.append(name)
        elif top in CORE_FORBIDDEN or top in THIRD_PARTY_ELSEWHERE:
            bad.append(name)  # I/O, a clock, the engine: not in the core
        elif top not in CORE_LIBRARIES and top not in sys.stdlib_module_names:
            bad.append(name)  # a library nobody listed as a parser
    assert not bad, f"{module} imports {sorted(bad)}"


def test_importing_the_whole_core_loads_no_engine_io_or_clock() -> None:
    """Run time: importing every core module loads no mitmproxy, no database, no network."""
    # (the standard library's own imports, such as logging's threading, are not the core's: the
    # static test above holds what the core names itself)
    watched = sorted({"mitmproxy", "sqlite3", "structlog", "psutil", "cryptography", "httpx", "pydantic",
                      "yaml", "uvicorn", "fastapi", "psycopg", "proxy.store", "proxy.engine",
                      "proxy.control", "proxy.rules", "proxy.audit", "proxy.metrics"})  # fmt: skip
    code = (
        "import sys; before = set(sys.modules); "
        f"import {', '.join(CORE)}; "
        f"watched = {watched!r}; "
        "new = set(sys.modules) - before; "
        "bad = sorted(m for m in new if any(m == w or m.startswith(w + '.') for w in watched)); "
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


OLD_PATHS = [
    ("proxy.hosts", "HostPattern"),
    ("proxy.placeholders", "PREFIX"),
    ("proxy.rules", "load_rules"),
    ("proxy.store", "Store"),
    ("proxy.secrets", "ValueSource"),
    ("proxy.secrets", "Secret"),
    ("proxy.control", "Control"),
    ("proxy.counters", "SharedCounters"),
    ("proxy.engine", "build_master"),
    ("proxy.cli", "main"),
    ("proxy.explain", "explain"),
]


def test_the_flat_paths_of_earlier_releases_still_import() -> None:
    code = "; ".join(f"from {m} import {n}" for m, n in OLD_PATHS) + (
        "; import proxy.hosts, proxy.core.hosts; assert proxy.hosts is proxy.core.hosts"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_python_dash_m_proxy_and_the_console_script_start() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "surrogate" in done.stdout
    script = Path(sys.executable).with_name("surrogate")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: surrogate")


# Issue 17: modules split along their seams before they pass ~400 lines; this bound leaves room
# for a docstring or a small addition, and fails a module that keeps growing instead of splitting.
MAX_LINES = 450


def test_no_module_grows_past_the_size_at_which_it_is_split() -> None:
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in MODULES.items()}
    big = {m: n for m, n in sizes.items() if n > MAX_LINES}
    assert not big, f"split these along their seams (lines): {big}"
