"""Real clients configured only by what `surrogate env` prints (explicit mode)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import ROOT, Env

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sandbox_env(env: Env) -> dict[str, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "env",
            "--rules",
            str(env.proxy.rules),
            "--claim",
            "c1",
            "--state-dir",
            str(env.proxy.state_dir),
            "--proxy",
            f"127.0.0.1:{env.proxy.port}",
            "--format",
            "dotenv",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
        env={**os.environ, "E2E_INJECTED_SECRET": env.injected},
    )
    printed = dict(line.split("=", 1) for line in done.stdout.splitlines())
    values = {k: v.strip('"') for k, v in printed.items()}
    assert values["SURROGATE_PLACEHOLDER_GH"] == env.placeholder
    for c in env.canaries:
        assert c not in done.stdout  # only the sandbox's own proxy credential, never a secret
    base = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.endswith("CA_BUNDLE")}
    return {**base, **values}


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
