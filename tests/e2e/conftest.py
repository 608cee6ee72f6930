"""End-to-end fixtures: one real upstream (HTTPS, test CA) and one real proxy process per module.

The credential values are canaries: distinctive random strings that must reach the upstream and
appear nowhere else. When the module's proxy stops, every artifact it wrote (audit file,
stderr) and every byte the tests' clients received (``received``) is scanned for them.
"""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness import ProxyProcess
from servers import TestCA, Upstream

NAMES = ["api.test", "other.test", "denied.test", "opaque.test"]


@dataclass
class Env:
    upstream: Upstream
    upstream_ca: Path
    proxy: ProxyProcess
    token: str  # claim c1's proxy token
    token2: str  # claim c2's
    secret: str  # c1 credential "gh", bound to api.test (substitution)
    injected: str  # c1 credential "inj", injected as X-Injected toward api.test
    secret2: str  # c2 credential "gh2", bound to api.test
    secret_file: Path
    placeholder: str = "surr_E2eGithubPlaceholder0001"
    placeholder2: str = "surr_E2eOtherClaimPlaceholder2"
    inj_placeholder: str = "surr_E2eInjectedPlaceholder03"
    received: list[bytes] = field(default_factory=list)
    more_canaries: list[str] = field(default_factory=list)  # values a test rotated in
    ca: TestCA | None = None  # the upstream CA, for tests that start another upstream

    @property
    def canaries(self) -> list[str]:
        return [self.secret, self.injected, self.secret2, *self.more_canaries]

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    @property
    def proxy_url(self) -> str:
        return self.proxy.url("c1", self.token)


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
    canary = lambda tag: f"CANARY{tag}{secrets.token_hex(12)}"  # noqa: E731
    secret, injected, secret2 = canary("gh"), canary("inj"), canary("ghtwo")
    token, token2 = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    for name, value in [
        ("secret-gh", secret),
        ("secret-gh2", secret2),
        ("token1", token),
        ("token2", token2),
    ]:
        (tmp / name).write_text(value + "\n")
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
    for what, data in artifacts.items():
        for c in e.canaries:
            assert c.encode() not in data, f"canary secret found in {what}"
