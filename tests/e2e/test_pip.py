"""`pip install` from a private package index through the proxy, with only the placeholder.

The index (`_pkgindex.py`: PEP 503 over HTTPS, Basic auth) accepts only the real secret as the
password. pip runs as its own process with a clean environment, the placeholder in its
`--index-url` userinfo, the proxy as `--proxy` and the proxy's CA as `--cert`: the Basic
credentials pip sends are decoded, swapped and re-encoded on the wire.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pkgindex import PackageIndex, Wheel, build_wheel
from harness import ProxyProcess
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_PipIndexPlaceholder00001"
HOST = "pkgs.test"
USER = "ci-reader"


@dataclass
class World:
    proxy: ProxyProcess
    index: PackageIndex
    wheel: Wheel
    secret: str


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with Stage(tmp_path) as st:
        secret = st.secret("pkgs", tag="pip", file="secret")
        st.token("tok", newline=False)
        wheel = build_wheel(
            "surrogate-e2e-demo", "0.1", "surrogate_e2e_demo", 'GREETING = "installed via surrogate"\n'
        )
        index = st.enter(PackageIndex(st.ca, HOST, password=secret, wheels=[wheel]))
        text = rules(
            [egress(HOST, index.port)],
            claim_id="c",
            credentials=[credential("pkgs", PH, [HOST], "file:secret")],
        )
        yield World(st.proxy(text, [HOST]), index, wheel, secret)


def clean_env(home: Path) -> dict[str, str]:
    """Only what a process needs to run: no PIP_*, no proxy or CA variables, no user pip config."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "SYSTEMROOT") if k in os.environ}
    env.update(HOME=str(home), PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1")
    return env


def test_pip_install_from_an_index_behind_basic_auth(world: World, tmp_path: Path) -> None:
    target = tmp_path / "target"
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--index-url",
            f"https://{USER}:{PH}@{HOST}:{world.index.port}/simple/",
            "--proxy",
            world.proxy.url("c", "tok"),
            "--cert",
            str(world.proxy.ca_pem),
            "--target",
            str(target),
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-input",
            "--retries",
            "0",
            "--timeout",
            "15",
            "-v",
            world.wheel.project,
        ],
        capture_output=True,
        text=True,
        env=clean_env(home),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert world.secret not in output

    installed = target / f"{world.wheel.module}.py"
    assert installed.read_text() == 'GREETING = "installed via surrogate"\n'
    assert any(p.name.endswith(".dist-info") for p in target.iterdir())

    # The index saw the project page and the wheel, each with the real secret and never the placeholder.
    expected = "Basic " + base64.b64encode(f"{USER}:{world.secret}".encode()).decode()
    targets = [t for _, t in world.index.seen]
    assert f"/simple/{world.wheel.project}/" in targets
    assert f"/packages/{world.wheel.filename}" in targets
    assert {auth for auth, _ in world.index.seen} == {expected}
    assert not any(PH in auth or PH in t for auth, t in world.index.seen)

    events = [e for e in world.proxy.audit_events() if e.get("event") == "request" and e["host"] == HOST]
    assert {e["path"] for e in events} >= {
        f"/simple/{world.wheel.project}/",
        f"/packages/{world.wheel.filename}",
    }
    for e in events:
        assert (e["status"], e["decision"]) == (200, "allow"), e
        assert e["credentials"] == [{"name": "pkgs", "version": 1}], e
