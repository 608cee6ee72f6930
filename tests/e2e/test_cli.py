"""The command line as an operator meets it: start-up refusals, CA export, rules check."""

from __future__ import annotations

import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import canary
import pytest
from harness import ROOT, free_port
from inprocess import surrogate as in_process
from world import Stage, claim, egress, rules

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


def test_the_banner_and_env_name_the_same_trust_bundle_and_it_verifies_the_proxy(tmp_path: Path) -> None:
    """issue 18 item 3: the banner told clients to trust the CA alone while `surrogate env` gave
    the bundle (system roots + CA); the CA alone fails every `intercept: false` host. Both name
    the bundle now, which holds the roots and the CA the proxy signs with, and curl trusting
    only it (as the banner's `export` line says) gets through an intercepted tunnel."""
    with Stage(tmp_path) as st:
        token = st.token(secrets.token_urlsafe(16), file="tok")
        upstream = st.upstream(["api.test"])
        proxy = st.proxy(
            rules([egress("api.test", upstream.port)], claims=[claim("c", token="file:tok")]), ["api.test"]
        )
        rules_path = proxy.rules
        deadline = time.monotonic() + 20
        while "CURL_CA_BUNDLE=" not in proxy.stderr() and time.monotonic() < deadline:
            time.sleep(0.05)
        banner = proxy.stderr()
        trusted = re.search(
            r"trust this bundle in the sandbox \(system roots \+ surrogate's CA\): (\S+)", banner
        )
        exported = re.search(r"export CURL_CA_BUNDLE=(\S+) SSL_CERT_FILE=(\S+)", banner)
        assert trusted and exported, banner
        env = surrogate(
            "env", "--rules", str(rules_path), "--claim", "c", "--state-dir", str(proxy.state_dir)
        )
        assert env.returncode == 0, env.stderr
        named = dict(re.findall(r"^export (\w+)=(\S+)$", env.stdout, re.M))
        bundle = Path(trusted[1])
        assert {exported[1], exported[2], named["SSL_CERT_FILE"], named["CURL_CA_BUNDLE"]} == {str(bundle)}
        text = bundle.read_text()
        assert text.endswith(proxy.ca_pem.read_text())
        assert text.count("-----BEGIN CERTIFICATE-----") > 1  # the system roots too
        done = subprocess.run(
            ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(bundle),
             "--proxy", proxy.url("c", token), f"https://api.test:{upstream.port}/"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout == "200", done.stderr


def test_creds_on_a_rules_file_claim_say_where_its_credentials_belong(tmp_path: Path) -> None:
    """issue 18 item 4: `surrogate creds put` on a claim the rules file declares answered
    `404: no claim 'static'`; every claims/creds command on it now says whose claims the control
    API holds and how to make one, exit 1, the value nowhere in the answer."""
    value = canary.make("cli")
    canary.source(tmp_path / "value", value)
    (tmp_path / "tok").write_text("static-proxy-token\n")
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(rules([egress("api.test")], claims=[claim("static", token="file:tok")]))
    state = tmp_path / "state"
    args = [sys.executable, "-m", "proxy", "control", "--rules", str(rules_path), "--state-dir", str(state)]
    with open(tmp_path / "control.stderr", "wb") as err:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 20
        while not (state / "control.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        commands = [
            ["creds", "put", "static", "gh", "--host", "api.test", "--value-file", str(tmp_path / "value")],
            ["creds", "patch", "static", "gh", "--value-file", str(tmp_path / "value")],
            ["creds", "list", "static"],
            ["creds", "get", "static", "gh"],
            ["creds", "delete", "static", "gh"],
            ["claims", "get", "static"],
            ["claims", "rotate-token", "static"],
            ["claims", "delete", "static"],
        ]
        for i, argv in enumerate(commands):
            # the first as the process an operator runs (its exit status); the rest through the
            # same main() in this process (tests/inprocess.py): the same parser, client and error
            # path, 7 interpreter starts fewer (8 starts were most of the test's 13 s serial)
            run = surrogate if i == 0 else in_process
            done = run(*argv, "--state-dir", str(state))
            assert done.returncode == 1, (argv, done.stdout, done.stderr)
            assert done.stderr.startswith(
                "surrogate: 409: claim 'static' is declared in the rules file, and the control API "
                "holds only the claims it created"
            ), (argv, done.stderr)
            assert "surrogate claims create --pool p --id ID" in done.stderr
            assert value not in done.stdout + done.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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


def test_a_second_proxy_on_a_state_dir_in_use_is_refused_and_the_first_keeps_its_socket(
    tmp_path: Path,
) -> None:
    """Seen on a fresh clone: a second ``make run`` (another port, the same .state) started, took
    over the first's control socket and emptied the node's limits table; once it stopped, the
    first's control API was unreachable. Every command that binds the control socket refuses a
    state dir another surrogate serves, before it creates anything."""
    (tmp_path / "first").mkdir()
    with Stage(tmp_path) as st:
        text = rules([egress("api.test")], claims=[])  # no claim: the test makes one through the CLI
        first = st.proxy(text, workdir=tmp_path / "first", upstream_ca=None)
        rules_path, state = first.rules, first.state_dir
        deadline = time.monotonic() + 20
        while surrogate("claims", "list", "--state-dir", str(state)).returncode != 0:
            assert time.monotonic() < deadline, first.stderr()
            time.sleep(0.2)
        assert (
            surrogate("claims", "create", "--pool", "p", "--id", "kept", "--state-dir", str(state)).returncode
            == 0
        )
        table = state / "limits.shm"
        before = (table.stat().st_ino, table.stat().st_mtime_ns)
        seconds = {
            "run": ["run", "--workers", "1", "--listen", f"127.0.0.1:{free_port()}"],
            "run-workers": ["run", "--workers", "2", "--listen", f"127.0.0.1:{free_port()}"],
            "control": ["control"],
        }
        for name, argv in seconds.items():
            done = surrogate(*argv, "--rules", str(rules_path), "--state-dir", str(state))
            assert done.returncode == 1, (name, done.stderr)
            assert done.stderr.startswith(
                f"surrogate: the control socket {state / 'control.sock'} answers: another surrogate "
                "serves this state dir"
            ), (name, done.stderr)
            assert "Traceback" not in done.stderr
            assert (table.stat().st_ino, table.stat().st_mtime_ns) == before, name
            listed = surrogate("claims", "list", "--state-dir", str(state))
            assert listed.returncode == 0 and '"id": "kept"' in listed.stdout, (name, listed.stderr)
        first.stop()
        # Stopped, its socket file stays behind and no longer counts: a new proxy starts there.
        assert (state / "control.sock").is_socket()
        st.proxy(rules_path, workdir=tmp_path / "first", upstream_ca=None).stop()
