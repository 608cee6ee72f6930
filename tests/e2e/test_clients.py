"""Real clients configured only by what `surrogate env` prints (explicit mode)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _sandboxenv import printed, printed_env, sandbox
from harness import Env
from servers import README_TEXT, Recorded

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sandbox_env(env: Env, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What `surrogate env` printed, plus PATH, a fresh HOME and LANG: nothing else."""
    printed = printed_env(env.proxy, "c1", {"E2E_INJECTED_SECRET": env.injected})
    assert printed["SURROGATE_PLACEHOLDER_GH"] == env.placeholder
    for c in env.canaries:
        assert not [v for v in printed.values() if c in v]  # only the sandbox's own proxy credential
    return sandbox(printed, tmp_path_factory.mktemp("sandbox-home"))


def test_curl_with_only_the_printed_environment(env: Env, sandbox_env: dict[str, str]) -> None:
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "-H",
            "Authorization: Bearer " + sandbox_env["SURROGATE_PLACEHOLDER_GH"],
            env.url("api.test", "/t/env-curl"),
        ],
        capture_output=True,
        text=True,
        env=sandbox_env,
        timeout=30,
        check=False,
    )
    env.received.append((done.stdout + done.stderr).encode())
    assert done.returncode == 0, done.stderr
    assert env.proxy.wait_event(path="/t/env-curl")["credentials"][0]["name"] in ("gh", "inj")
    [rec] = [r for r in env.upstream.requests if r.path == "/t/env-curl"]
    assert [v for k, v in rec.headers if k.lower() == "authorization"] == [f"Bearer {env.secret}"]


def test_python_requests_with_only_the_printed_environment(env: Env, sandbox_env: dict[str, str]) -> None:
    script = (
        "import os, requests\n"
        f"r = requests.get({env.url('api.test', '/t/env-requests')!r},"
        " headers={'X-Api-Key': os.environ['SURROGATE_PLACEHOLDER_GH']}, timeout=20)\n"
        "print(r.status_code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=sandbox_env,
        timeout=60,
        check=False,
    )
    env.received.append((done.stdout + done.stderr).encode())
    assert done.stdout.strip() == "200", done.stderr
    [rec] = [r for r in env.upstream.requests if r.path == "/t/env-requests"]
    assert [v for k, v in rec.headers if k.lower() == "x-api-key"] == [env.secret]


def test_git_clone_with_only_the_printed_environment(
    env: Env, sandbox_env: dict[str, str], tmp_path: Path
) -> None:
    url = f"https://git:{sandbox_env['SURROGATE_PLACEHOLDER_GH']}@api.test:{env.upstream.port}/git/repo.git"
    done = subprocess.run(
        ["git", "clone", "-q", url, str(tmp_path / "clone")],
        capture_output=True,
        text=True,
        env={**sandbox_env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"},
        timeout=60,
        check=False,
    )
    env.received.append((done.stdout + done.stderr).encode())
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "clone" / "README").read_text() == README_TEXT
    sent = {
        v for r in env.upstream.requests if r.path.startswith("/git/") for v in _values(r, "authorization")
    }
    assert "Basic " + base64.b64encode(f"git:{env.secret}".encode()).decode() in sent


def test_wget_with_the_printed_note(env: Env, sandbox_env: dict[str, str], tmp_path: Path) -> None:
    """wget reads https_proxy but no CA variable: `surrogate env` says so in a comment, naming the
    wgetrc line; the test writes that very line into the wgetrc WGETRC names."""
    text = printed(env.proxy, "c1", {"E2E_INJECTED_SECRET": env.injected})
    note = next(line for line in text.splitlines() if line.startswith("# wget"))
    [line] = re.findall(r"'(ca_certificate = [^']+)'", note)
    (tmp_path / "wgetrc").write_text(line + "\n")
    done = subprocess.run(
        [
            "wget",
            "-q",
            "-O",
            "-",
            "--header",
            "Authorization: Bearer " + sandbox_env["SURROGATE_PLACEHOLDER_GH"],
            env.url("api.test", "/t/env-wget"),
        ],
        capture_output=True,
        text=True,
        env={**sandbox_env, "WGETRC": str(tmp_path / "wgetrc")},
        timeout=60,
        check=False,
    )
    env.received.append((done.stdout + done.stderr).encode())
    assert done.returncode == 0, done.stderr
    [rec] = [r for r in env.upstream.requests if r.path == "/t/env-wget"]
    assert [v for k, v in rec.headers if k.lower() == "authorization"] == [f"Bearer {env.secret}"]


def _values(rec: Recorded, name: str) -> list[str]:
    return [v for k, v in rec.headers if k.lower() == name]
