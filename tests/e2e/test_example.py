"""The README's worked example against rules/example.yaml, the embedded default.

Only the offline parts: a violation is refused before any upstream connection, and a host no
rule allows is refused at CONNECT, so neither needs the internet.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, ProxyProcess
from world import Stage

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "init", "--state-dir", str(ROOT / ".state")],
        check=True,
        cwd=ROOT,
    )
    with Stage(tmp_path_factory.mktemp("demo")) as st:
        yield st.proxy(ROOT / "rules" / "example.yaml", upstream_ca=None)


def curl(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    token = (ROOT / ".state" / "demo-proxy-token").read_text().strip()
    return subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "10",
            "-x",
            proxy.url("demo", token),
            "--cacert",
            str(proxy.ca_pem),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


def test_readme_violation_example(demo: ProxyProcess) -> None:
    done = curl(
        demo, "-H", "Authorization: Bearer surr_DemoGithubPlaceholder0001", "https://httpbin.org/headers"
    )
    assert '"error": "placeholder_violation"' in done.stdout
    event = demo.wait_event(host="httpbin.org")
    assert (event["decision"], event["rule"]) == ("violation", "demo.egress[2] httpbin.org")


def test_readme_default_deny_example(demo: ProxyProcess) -> None:
    done = curl(demo, "https://example.com/")
    assert "CONNECT tunnel failed, response 403" in done.stderr
    assert demo.wait_event(host="example.com")["reason"] == "no_rule"


def test_demo_secret_never_in_audit_or_logs(demo: ProxyProcess) -> None:
    curl(demo, "-H", "Authorization: Bearer surr_DemoGithubPlaceholder0001", "https://httpbin.org/x")
    demo.wait_event(path="/x")
    secret = (ROOT / ".state" / "demo-github-token").read_text().strip()
    assert secret not in demo.audit_path.read_text() + demo.stderr()
    assert Path(demo.audit_path).read_text().count("\n") >= 1
