"""Installing surrogate: ``pip install -e .`` (what ``make run`` and ``make test`` do) prints no
setuptools warning (issue 18 item 10).

setuptools (84) picks its editable strategy from the layout: with no ``package-dir``, a flat
checkout gets a meta path finder and the warning "Please be careful with folders in your
working directory with the same name as your package" (pip 26 relays every Python warning the
build backend emits, as ``BuildBackendWarning``, even with ``-q``). ``package-dir = {"" = "."}``
(pyproject.toml) makes it a plain ``.pth`` that puts the checkout on ``sys.path``, as pytest's
``pythonpath`` does anyway; a regular wheel holds the same files either way.

The test calls the build backend's PEP 660 hook itself, offline, on a copy of the project, and
records the warnings it emits. It does not run pip: ``pip install --prefix`` from this
environment would first uninstall the surrogate installed here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PACKAGES = sorted(
    {name.split(".")[0] for name in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
)

BUILD = """\
import json, sys, warnings
import setuptools.build_meta as backend
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    wheel = backend.build_editable(sys.argv[1])
print(json.dumps({"wheel": wheel, "warnings": [f"{w.category.__name__}: {w.message}" for w in seen]}))
"""


def _copy_project(to: Path) -> Path:
    to.mkdir()
    shutil.copy(ROOT / "pyproject.toml", to)
    for name in PACKAGES:
        shutil.copytree(ROOT / name, to / name, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_an_editable_build_warns_nothing_and_points_at_the_checkout(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", reason="the test extra installs setuptools (the build backend)")
    project = _copy_project(tmp_path / "project")
    out = tmp_path / "wheel"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["warnings"] == []
    with zipfile.ZipFile(out / result["wheel"]) as wheel:
        pth = [wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".pth")]
    assert [p.strip() for p in pth] == [str(project)]  # the checkout, where proxy/, addons/, certs/ are


def test_the_packages_setuptools_finds_are_the_three_importable_ones() -> None:
    assert PACKAGES == ["addons", "certs", "proxy"]
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"": "."}
