"""``surrogate control`` behind a cluster Service: a TCP listener beyond loopback only over TLS and
under the names its clients use (``--control-name``); a proxy node (``surrogate run``) never gets
one. The listener under test is bound to loopback (tests reach only loopback) but configured
exactly as the Deployment in deploy/kubernetes configures it: TLS, a name, the operator token."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ROOT, free_port
from servers import TestCA
from world import egress, rules

pytestmark = pytest.mark.e2e

NAME = "surrogate-control.surrogate.svc"
RULES = rules([egress("api.test")], claims=[])


def command(tmp: Path, kind: str, *extra: str) -> list[str]:
    (tmp / "rules.yaml").write_text(RULES)
    cmd = [
        sys.executable,
        "-m",
        "proxy",
        kind,
        "--rules",
        str(tmp / "rules.yaml"),
        "--state-dir",
        str(tmp / "s"),
    ]
    return cmd + ["--node", "ctl-1", *extra]


def refused(tmp: Path, kind: str, *extra: str) -> str:
    done = subprocess.run(
        command(tmp, kind, *extra), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode in (1, 2), done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.fixture
def tls(tmp_path: Path) -> tuple[TestCA, Path, Path, Path]:
    ca = TestCA(tmp_path)
    cert = ca.ca.issue_cert(NAME)
    chain, key = tmp_path / "control.pem", tmp_path / "control.key"
    cert.cert_chain_pems[0].write_to_path(str(chain))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(chain), append=True)
    cert.private_key_pem.write_to_path(str(key))
    token = tmp_path / "operator"
    token.write_text("operator-" + secrets.token_hex(12) + "\n")
    return ca, chain, key, token


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "surrogate control serves another address only with --control-tls-cert"),
        (["--control-name", NAME], "surrogate control serves another address only with --control-tls-cert"),
        (["tls"], "surrogate control serves another address only with --control-tls-cert"),
        (["tls-cert-only", "--control-name", NAME], "--control-tls-cert and --control-tls-key go together"),
    ],
    ids=["no-tls-no-name", "name-without-tls", "tls-without-name", "cert-without-key"],
)
def test_another_address_needs_tls_and_a_name(
    tmp_path: Path, tls: tuple[TestCA, Path, Path, Path], extra: list[str], message: str
) -> None:
    _, chain, key, token = tls
    args = ["--control-tcp", f"0.0.0.0:{free_port()}", "--control-token-file", str(token)]
    for e in extra:
        if e == "tls":
            args += ["--control-tls-cert", str(chain), "--control-tls-key", str(key)]
        elif e == "tls-cert-only":
            args += ["--control-tls-cert", str(chain)]
        else:
            args.append(e)
    assert message in refused(tmp_path, "control", *args)


def test_a_proxy_node_never_serves_the_control_api_beyond_loopback(
    tmp_path: Path, tls: tuple[TestCA, Path, Path, Path]
) -> None:
    _, chain, key, token = tls
    base = ["--control-tcp", f"0.0.0.0:{free_port()}", "--control-token-file", str(token), "--workers", "1"]
    assert "--control-tcp must be a loopback address" in refused(tmp_path, "run", *base)
    tls_args = ["--control-tls-cert", str(chain), "--control-tls-key", str(key), "--control-name", NAME]
    assert "unrecognized arguments: --control-tls-cert" in refused(tmp_path, "run", *base, *tls_args)


@pytest.fixture
def served(tmp_path: Path, tls: tuple[TestCA, Path, Path, Path]) -> Iterator[tuple[int, Path, str]]:
    ca, chain, key, token = tls
    port = free_port()
    args = [
        "--control-tcp",
        f"127.0.0.1:{port}",
        "--control-token-file",
        str(token),
        "--control-socket",
        "none",
    ]
    args += ["--control-tls-cert", str(chain), "--control-tls-key", str(key), "--control-name", NAME]
    args += ["--audit-file", str(tmp_path / "audit.jsonl")]
    with open(tmp_path / "control.stderr", "wb") as err:
        proc = subprocess.Popen(
            command(tmp_path, "control", *args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 20
        while curl(port, ca.ca_pem, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, (tmp_path / "control.stderr").read_text()
            assert proc.poll() is None, (tmp_path / "control.stderr").read_text()
            time.sleep(0.1)
        yield port, ca.ca_pem, token.read_text().strip()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def curl(
    port: int, cacert: Path, path: str, *args: str, host: str = NAME, scheme: str = "https"
) -> tuple[int, str]:
    cmd = [
        "curl",
        "-sS",
        "--max-time",
        "10",
        "--resolve",
        f"{host}:{port}:127.0.0.1",
        "--cacert",
        str(cacert),
    ]
    cmd += ["-o", "-", "-w", "\n%{http_code}", *args, f"{scheme}://{host}:{port}{path}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    body, _, code = done.stdout.rpartition("\n")
    return int(code or 0), body


def test_the_service_listener_serves_tls_under_its_name_with_the_token(served: tuple[int, Path, str]) -> None:
    port, cacert, token = served
    bearer = ["-H", f"Authorization: Bearer {token}"]
    create = ["-X", "POST", "-H", "Content-Type: application/json", "-d", '{"id": "c1", "pool": "p"}']
    status, body = curl(port, cacert, "/v1/claims", *bearer, *create)
    assert status == 201, body
    assert curl(port, cacert, "/v1/claims", *bearer)[0] == 200
    status, body = curl(port, cacert, "/readyz")  # a probe: no token
    assert status == 200 and json.loads(body)["node"] == "ctl-1"
    assert curl(port, cacert, "/v1/claims")[0] == 401  # everything else needs the token


def test_the_service_listener_refuses_other_names_and_cleartext(served: tuple[int, Path, str]) -> None:
    port, cacert, token = served
    bearer = ["-H", f"Authorization: Bearer {token}"]
    # the certificate names the Service; a Host naming something else is refused (DNS rebinding)
    assert curl(port, cacert, "/v1/claims", *bearer, "-H", f"Host: evil.example:{port}")[0] == 403
    assert curl(port, cacert, "/v1/claims", *bearer, "-k", host="evil.example")[0] == 403
    # no cleartext HTTP on the TLS port: curl gets no HTTP answer
    assert curl(port, cacert, "/v1/claims", *bearer, scheme="http")[0] in (0, 400)
