"""The command line as an operator meets it: start-up refusals, CA export, rules check."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT

pytestmark = pytest.mark.e2e


def surrogate(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_run_refuses_a_bad_rules_file_with_file_line_and_field(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n        colour: red\n")
    done = surrogate(
        "run", "--rules", str(rules), "--state-dir", str(tmp_path / "s"), "--listen", "127.0.0.1:1"
    )
    assert done.returncode == 1
    assert f"{rules}:6:17: pools.p.egress[0].colour: unknown field 'colour'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()  # nothing started, nothing created


def test_run_refuses_a_literal_secret_without_echoing_it(tmp_path: Path) -> None:
    rules = tmp_path / "literal.yaml"
    rules.write_text(
        "version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n"
        "claims:\n  - id: c\n    pool: p\n    proxy_token: env:HOME\n    credentials:\n"
        "      - name: gh\n        value: ghp_ThisIsALiteralSecret123\n"
        "        placeholder: surr_AAAAAAAAAAAAAAAAAAAA\n        hosts: [api.test]\n"
    )
    done = surrogate("rules", "check", str(rules))
    assert done.returncode == 1
    assert "claims[0].credentials[0].value" in done.stderr
    assert "ghp_ThisIsALiteralSecret123" not in done.stderr + done.stdout


def test_ca_export_prints_the_ca_the_proxy_signs_with(tmp_path: Path) -> None:
    assert surrogate("ca", "export", "--state-dir", str(tmp_path)).returncode == 1
    assert surrogate("demo", "init", "--state-dir", str(tmp_path)).returncode == 0
    done = surrogate("ca", "export", "--state-dir", str(tmp_path))
    assert done.returncode == 0
    assert done.stdout.startswith("-----BEGIN CERTIFICATE-----")
    assert done.stdout == (tmp_path / "ca" / "mitmproxy-ca-cert.pem").read_text()
    assert (tmp_path / "ca" / "mitmproxy-ca.pem").stat().st_mode & 0o077 == 0  # key not readable by others


def test_the_example_rules_file_is_valid_once_demo_init_ran() -> None:
    # make run's own preparation; the example reads ../.state/demo-*-token
    assert surrogate("demo", "init", "--state-dir", str(ROOT / ".state")).returncode == 0
    done = surrogate("rules", "check", "rules/example.yaml")
    assert done.returncode == 0, done.stderr


def test_usage_errors_exit_2() -> None:
    assert surrogate("run").returncode == 2
    assert surrogate("run", "--rules", "x.yaml", "--listen", "nonsense").returncode == 2


def test_rules_explain_from_the_command_line() -> None:
    assert surrogate("demo", "init", "--state-dir", str(ROOT / ".state")).returncode == 0
    done = surrogate(
        "rules",
        "explain",
        "--rules",
        "rules/example.yaml",
        "--claim",
        "demo",
        "GET",
        "https://httpbin.org/headers",
        "-H",
        "Authorization: Bearer surr_DemoGithubPlaceholder0001",
    )
    assert done.returncode == 4, done.stderr  # the exit status of a violation
    assert "placeholder_violation" in done.stdout and "github" in done.stdout
    secret = (ROOT / ".state" / "demo-github-token").read_text().strip()
    assert secret not in done.stdout


def test_audit_why_with_an_unknown_id_exits_1(tmp_path: Path) -> None:
    (tmp_path / "audit.jsonl").write_text("")
    done = surrogate(
        "audit", "why", "nope", "--audit-file", str(tmp_path / "audit.jsonl"), "--rules", "rules/example.yaml"
    )
    assert done.returncode == 1 and "nope" in done.stderr and "Traceback" not in done.stderr


RISKY = sorted((ROOT / "tests" / "rules").glob("bad-credential-host-*.yaml"))


@pytest.mark.parametrize("bad", RISKY, ids=[p.stem for p in RISKY])
def test_rules_check_refuses_a_credential_host_that_looks_safe_and_is_not(tmp_path: Path, bad: Path) -> None:
    """issue 13 class 9: *.com, *.herokuapp.com, *.on.aws, *.googleapis.com, confusable IDN."""
    rules = tmp_path / bad.name
    shutil.copyfile(bad, rules)
    for name in ("proxy-token", "example-token"):
        (tmp_path / name).write_text("t\n")
    done = surrogate("rules", "check", str(rules))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{rules}:16:13: claims[0].credentials[0].hosts[0]: credential host " in done.stderr
    assert "Public Suffix List" in done.stderr or "scripts" in done.stderr or "look Latin" in done.stderr


def test_rules_check_warns_on_risky_hosts_and_exits_0(tmp_path: Path) -> None:
    rules = tmp_path / "warn-risky-hosts.yaml"
    shutil.copyfile(ROOT / "tests" / "rules" / rules.name, rules)
    for name in ("proxy-token", "example-token"):
        (tmp_path / name).write_text("t\n")
    done = surrogate("rules", "check", str(rules))
    assert done.returncode == 0, done.stderr
    assert "(7 warnings)" in done.stdout
    assert f"{rules}:9:15: warning: pools.demo.egress[2].host: *.on.aws spans" in done.stderr
    assert f"{rules}:24:13: warning: claims[0].credentials[0].hosts[1]: credential host vault.internal" in (
        done.stderr
    )


def test_run_reads_every_value_source_and_refuses_to_start_without_them(tmp_path: Path) -> None:
    """``rules check`` needs no secret (issue 18 item 11); ``run`` still reads every source at
    start and refuses, naming each, before it listens."""
    (tmp_path / "rules").mkdir()
    rules = tmp_path / "rules" / "example.yaml"
    shutil.copyfile(ROOT / "rules" / "example.yaml", rules)  # no ../.state: a fresh clone
    assert surrogate("rules", "check", str(rules)).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = surrogate(
        "run", "--rules", str(rules), "--state-dir", str(tmp_path / "state"), "--workers", "1",
        "--listen", f"127.0.0.1:{port}", "--control-socket", "none",
    )  # fmt: skip
    assert done.returncode == 1
    assert f"{rules}:31:" in done.stderr and "demo-proxy-token" in done.stderr
    assert f"{rules}:35:" in done.stderr and "demo-github-token" in done.stderr
