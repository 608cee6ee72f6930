"""Start and stop a real ``surrogate run`` process for end-to-end tests and benchmarks.

The proxy runs as its own process (``python -m proxy run``) on a free loopback port, with its
own state dir (CA) in a temp folder, audit events in a file, and stderr in a file, so tests and
the canary scan can read every artifact it wrote. It is stopped by its PID.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import Upstream

ROOT = Path(__file__).resolve().parent.parent


def _port_band() -> range:
    """The ports :func:`free_port` hands out in this process: below the kernel's ephemeral range
    (``net.ipv4.ip_local_port_range``), where no server bound to port 0 and no client's source port
    lands, cut into one band per xdist worker so two workers never choose the same port. A port
    taken from the ephemeral range could be taken again by another worker's server between the
    choice and the proxy's bind: the harness then saw that server answer and took it for the proxy."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    low = max(low, 12000)
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(name[2:]) if name[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    width = (low - 10000) // count
    return range(10000 + index * width, 10000 + (index + 1) * width)


_band = _port_band()
_next = [_band.start + (os.getpid() * 7) % len(_band)]


def free_port() -> int:
    """A loopback port nobody holds now, from this process's band (:func:`_port_band`), taken in
    turn so a port just let go is not handed out again soon."""
    for _ in range(len(_band)):
        port = _next[0]
        _next[0] = port + 1 if port + 1 < _band.stop else _band.start
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_band.start}-{_band.stop - 1}")


_held: list[socket.socket] = []  # dead_port's sockets, open until the process ends


def dead_port() -> int:
    """A loopback port where a connect is refused, held for the session: the socket is bound but
    never listens (Linux answers a SYN to it with RST), so no other test, nor another xdist
    worker's server, can take the port between the choice and the refused connect."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
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

    def start(self, timeout: float = 45.0) -> ProxyProcess:  # N workers start slowly on a loaded machine
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
        text = self.audit_path.read_text()
        complete = text[: text.rfind("\n") + 1]  # a line still being written is no event yet
        return [json.loads(line) for line in complete.splitlines() if line]

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


@dataclass
class World:
    """A running proxy and upstream as a hostile sandbox sees them: claim ``agent`` (``token``)
    holding one credential (``secret``, a canary) behind placeholder ``placeholder``. Every byte a
    client got back is kept in ``received`` for the canary check."""

    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str
    placeholder: str
    received: list[bytes] = field(default_factory=list)

    def url(self, path: str, host: str = "api.test") -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    def curl(self, *args: str, claim: str = "agent") -> subprocess.CompletedProcess[bytes]:
        """curl through the proxy as ``claim``; stdout ends with a newline and the status code."""
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "20",
                "-x",
                self.proxy.url(claim, self.token),
                "--cacert",
                str(self.proxy.ca_pem),
                "-w",
                "\n%{http_code}",
                *args,
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        self.received.append(done.stdout + done.stderr)
        return done

    def paths(self, prefix: str) -> list[str]:
        """Request targets the upstream received that start with ``prefix``."""
        return [r.path for r in self.upstream.requests if r.path.startswith(prefix)]

    def proxy_auth(self, claim: str = "agent") -> str:
        return "Basic " + base64.b64encode(f"{claim}:{self.token}".encode()).decode()

    @contextlib.contextmanager
    def tls_tunnel(
        self, host: str = "api.test", claim: str = "agent", timeout: float = 10, alpn: str | None = None
    ) -> Iterator[ssl.SSLSocket]:
        """``claim``'s CONNECT tunnel to ``host`` on the upstream's port, with TLS (under the
        proxy's CA) inside it; ``alpn``: the one protocol offered, which must be chosen."""
        port = self.upstream.port
        with socket.create_connection(("127.0.0.1", self.proxy.port), timeout=timeout) as raw:
            raw.sendall(
                f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Proxy-Authorization: {self.proxy_auth(claim)}\r\n\r\n".encode()
            )
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
            if alpn is not None:
                ctx.set_alpn_protocols([alpn])
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                assert alpn is None or tls.selected_alpn_protocol() == alpn
                yield tls

    def tunnel_request(
        self, head: bytes, host: str = "api.test", claim: str = "agent", read_timeout: float = 10
    ) -> bytes:
        """Send raw bytes (a request head, maybe more) through ``claim``'s CONNECT tunnel to
        ``host`` and TLS, and return everything read back until the proxy closes."""
        data = b""
        with self.tls_tunnel(host, claim, read_timeout) as tls:
            try:
                tls.sendall(head)
                while chunk := tls.recv(65536):
                    data += chunk
            except (ConnectionError, ssl.SSLError, TimeoutError):
                pass  # closed while we still wrote, or kept open: what it sent is in `data`
        self.received.append(data)
        return data


def status_line(data: bytes) -> bytes:
    """The status code of the first response in raw bytes (b"" when there is none)."""
    parts = data.split(b"\r\n", 1)[0].split(b" ")
    return parts[1] if len(parts) > 1 and parts[0].startswith(b"HTTP/") else b""


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
    ca: Any = None  # the upstream's servers.TestCA, for tests that start another upstream

    @property
    def canaries(self) -> list[str]:
        return [self.secret, self.injected, self.secret2, *self.more_canaries]

    def url(self, host: str, path: str) -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    @property
    def proxy_url(self) -> str:
        return self.proxy.url("c1", self.token)
