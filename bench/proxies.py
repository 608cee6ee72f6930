"""The proxies under test, each its own process pinned to the proxy core with taskset.

- bare ``mitmdump``: every default addon, flow output off, bodies streamed, lazy upstream
  connections, upstream TLS verified against the bench CA; no proxy authentication (the
  ``Proxy-Authorization`` hey sends is simply dropped);
- surrogate: ``python -m proxy run --workers 1`` through tests/harness.ProxyProcess (the lean
  engine: only our chain, cached addon dispatch), a rules file with one claim and one credential
  (swapped on every request), ``--resolve`` pins for the upstream name and ``--upstream-ca`` for
  the bench CA; for the workers comparison, ``--workers 1`` and ``--workers 2``, unpinned.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
from harness import ProxyProcess
from load import Target
from upstreams import free_port, pinned, stop, wait_listening

UPSTREAM_HOST = "api.test"
CLAIM, TOKEN = "c", "benchtoken"
PLACEHOLDER = "surr_BenchPlaceholder000000001"
MITMDUMP = Path(sys.executable).with_name("mitmdump")


class Mitmdump:
    def __init__(self, tmp: Path, upstream_ca: Path, cpu: int | None) -> None:
        self.confdir = tmp / "mitmdump"
        self.port = free_port()
        self.cmd = pinned(
            [
                str(MITMDUMP),
                "-q",
                "--listen-host",
                "127.0.0.1",
                "--listen-port",
                str(self.port),
                "--set",
                "stream_large_bodies=1",
                "--set",
                "connection_strategy=lazy",
                "--set",
                f"ssl_verify_upstream_trusted_ca={upstream_ca}",
                "--set",
                f"confdir={self.confdir}",
                "--set",
                "flow_detail=0",
            ],
            cpu,
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Mitmdump:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, "mitmdump", timeout=20)
        return self

    def target(self) -> Target:
        assert self.proc is not None
        return Target(
            "mitmdump",
            "127.0.0.1",  # mitmdump resolves names itself and cannot be told where api.test is
            self.confdir / "mitmproxy-ca-cert.pem",
            f"http://user:pass@127.0.0.1:{self.port}",
            self.proc.pid,
        )

    def stop(self) -> None:
        stop(self.proc)


def write_rules(tmp: Path, ports: list[int]) -> Path:
    """One pool allowing the bench upstreams, one claim, one credential bound to the upstream."""
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "secret").write_text("BenchSecretValue0123456789\n")
    rules = tmp / "rules.yaml"
    rules.write_text(
        textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            # the bench measures the proxy, not a claim's allowance (defaults: 100 req/s, burst 200)
            limits: {{connections: 100000, requests_per_second: 1000000, burst: 1000000}}
            egress:
              - host: {UPSTREAM_HOST}
                ports: {sorted(ports)}
        claims:
          - id: {CLAIM}
            pool: p
            proxy_token: file:token
            credentials:
              - name: k
                value: file:secret
                placeholder: {PLACEHOLDER}
                hosts: [{UPSTREAM_HOST}]
        """)
    )
    return rules


class Surrogate:
    def __init__(
        self,
        name: str,
        workdir: Path,
        rules: Path,
        upstream_ca: Path,
        cpu: int | str | None,
        workers: int = 1,
    ) -> None:
        self.name = name
        workdir.mkdir(parents=True, exist_ok=True)
        self.process = ProxyProcess(
            rules, workdir, upstream_ca=upstream_ca, resolve={UPSTREAM_HOST: "127.0.0.1"}, workers=workers
        )
        self.process.args = pinned(self.process.args, cpu)

    def start(self) -> Surrogate:
        self.process.start()
        return self

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def target(self, claim: str = CLAIM, token: str = TOKEN) -> Target:
        return Target(self.name, UPSTREAM_HOST, self.process.ca_pem, self.process.url(claim, token), self.pid)

    def api(self, timeout: float = 30.0) -> httpx.Client:
        """A client of the control API's Unix socket (it appears shortly after the listener)."""
        sock = self.process.state_dir / "control.sock"
        deadline = time.monotonic() + timeout
        while not sock.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no control socket at {sock}")
            time.sleep(0.05)
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://c", timeout=timeout
        )

    def stop(self) -> None:
        self.process.stop()
