"""Start and stop a real ``surrogate run`` process for end-to-end tests and benchmarks.

The proxy runs as its own process (``python -m proxy run``) on a free loopback port, with its
own state dir (CA) in a temp folder, audit events in a file, and stderr in a file, so tests and
the canary scan can read every artifact it wrote. It is stopped by its PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyProcess:
    def __init__(
        self,
        rules: Path,
        workdir: Path,
        upstream_ca: Path | None = None,
        resolve: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        workers: int | None = None,
    ) -> None:
        self.rules = rules
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.audit_path = workdir / "audit.jsonl"
        self.stderr_path = workdir / "proxy.stderr"
        self.port = free_port()
        self.args = [
            sys.executable,
            "-m",
            "proxy",
            "run",
            "--rules",
            str(rules),
            "--state-dir",
            str(self.state_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--audit-file",
            str(self.audit_path),
            "--workers",
            # one process unless a test asks for more; SURROGATE_E2E_WORKERS=N runs a suite with N
            str(workers or int(os.environ.get("SURROGATE_E2E_WORKERS", "1"))),
        ]
        if upstream_ca is not None:
            self.args += ["--upstream-ca", str(upstream_ca)]
        for name, addr in (resolve or {}).items():
            self.args += ["--resolve", f"{name}:{addr}"]
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ca_pem(self) -> Path:
        return self.state_dir / "ca" / "mitmproxy-ca-cert.pem"

    def url(self, claim: str, token: str) -> str:
        return f"http://{claim}:{token}@127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ProxyProcess:
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=err
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}: {self.stderr()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"proxy did not listen within {timeout}s: {self.stderr()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line]

    def wait_event(self, timeout: float = 5.0, **match: Any) -> dict[str, Any]:
        """The one audit event whose fields equal ``match`` (waits: events are written at flow end)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.audit_events() if all(e.get(k) == v for k, v in match.items())]
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise AssertionError(f"{len(found)} audit events match {match}: {found}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no audit event matches {match}: {self.audit_events()}")
            time.sleep(0.05)
