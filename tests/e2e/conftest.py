"""End-to-end fixtures: one real upstream (HTTPS, test CA) and one real proxy process per module.

The credential values are canaries (tests/canary.py): distinctive random strings that must reach
the upstream and appear nowhere else. When the module's proxy stops, every artifact it wrote
(audit file, stderr) and every byte the tests' clients received (``received``) is checked for
them; at the end of the session every file the suite wrote is (tests/conftest.py).
"""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path

import canary
import pytest
from harness import Env, ProxyProcess
from servers import TestCA, Upstream

NAMES = ["api.test", "other.test", "denied.test", "opaque.test"]


def write_rules(tmp: Path, port: int) -> Path:
    rules = tmp / "rules.yaml"
    rules.write_text(
        textwrap.dedent(
            f"""\
            version: 1
            pools:
              p:
                egress:
                  - host: api.test
                    ports: [{port}]
                  - host: other.test
                    ports: [{port}]
                  - host: opaque.test
                    ports: [{port}]
                    intercept: false
                  - host: api.test
                    ports: [80]
                    scheme: http
            claims:
              - id: c1
                pool: p
                proxy_token: file:token1
                credentials:
                  - name: gh
                    value: file:secret-gh
                    placeholder: surr_E2eGithubPlaceholder0001
                    hosts: [api.test]
                  - name: inj
                    value: env:E2E_INJECTED_SECRET
                    placeholder: surr_E2eInjectedPlaceholder03
                    hosts: [api.test]
                    inject:
                      set_header: X-Injected
                      format: "Token {{value}}"
              - id: c2
                pool: p
                proxy_token: file:token2
                credentials:
                  - name: gh2
                    value: file:secret-gh2
                    placeholder: surr_E2eOtherClaimPlaceholder2
                    hosts: [api.test]
            """
        )
    )
    return rules


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("e2e")
    secret, injected, secret2 = canary.make("gh"), canary.make("inj"), canary.make("ghtwo")
    token, token2 = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    canary.source(tmp / "secret-gh", secret)
    canary.source(tmp / "secret-gh2", secret2)
    (tmp / "token1").write_text(token + "\n")
    (tmp / "token2").write_text(token2 + "\n")
    ca = TestCA(tmp)
    upstream = Upstream(ca, NAMES, git_password=secret, tmpdir=tmp).start()
    rules = write_rules(tmp, upstream.port)
    proxy = ProxyProcess(
        rules,
        tmp,
        upstream_ca=ca.ca_pem,
        resolve={n: "127.0.0.1" for n in NAMES},
        env={"E2E_INJECTED_SECRET": injected},
    )
    e = Env(upstream, ca.ca_pem, proxy, token, token2, secret, injected, secret2, tmp / "secret-gh", ca=ca)
    try:
        proxy.start()
        yield e
    finally:
        proxy.stop()
        upstream.stop()
    # Invariant 1: no canary in anything the sandbox could read or any log the proxy wrote.
    artifacts = {
        "audit file": proxy.audit_path.read_bytes() if proxy.audit_path.exists() else b"",
        "proxy stderr": proxy.stderr_path.read_bytes(),
        "client-received bytes": b"".join(e.received),
    }
    canary.assert_absent(artifacts, e.canaries)
