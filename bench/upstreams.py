"""The fast upstreams the benchmark loads: nginx (small response, 50 MB file) and an SSE server.

Both serve TLS under one throwaway trustme CA, on loopback, from a temp dir written at run time.
nginx is Debian's binary run as a foreground child (``-p DIR -c CONF -g 'daemon off;'``): no
system config is read or touched. nginx cannot generate a timed event stream, so SSE comes from
``bench/sse_server.py``, a tiny asyncio server run as its own process (its timers must not share
a GIL with the measuring client). Every process is started here and stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from servers import TestCA

HOSTNAMES = ("api.test", "localhost", "127.0.0.1")  # surrogate pins api.test; mitmdump dials the IP
SMALL_BODY = b"x" * 100  # the 100-byte response
BIG_MB = 50
MIB = 1024 * 1024
BIG_BYTES = BIG_MB * MIB
# an API's JSON as json.dumps writes it (ensure_ascii): every string's \" \n \u00e9 and a URL's
# %3A are escapes, thousands per 256 KiB read, of bytes a typical secret does not hold
JSON_RECORD = (
    b'{"id": 1347, "url": "https://api.test/repos/octo/proj/issues/1347", "html_url": '
    b'"https://api.test/octo/proj/issues?q=is%3Aopen+label%3Abug", "title": "Caf\\u00e9 na\\u00efve '
    b'r\\u00e9sum\\u00e9 fix", "body": "Steps:\\n1. run \\"make test\\"\\n2. see C:\\\\tmp\\n", '
    b'"user": {"login": "octocat", "avatar_url": "https://avatars.test/u/583231?v=4"}, '
    b'"labels": [{"name": "bug", "color": "d73a4a"}], "state": "open", "comments": 12}, '
)
SSE_EVENTS = 20  # one every 100 ms for 2 s
SSE_PERIOD_S = 0.1
_SSE_SERVER = Path(__file__).with_name("sse_server.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cmd: list[str], cpu: int | str | None) -> list[str]:
    """``cmd`` run under ``taskset -c CPU`` (taskset execs it: the PID stays the command's); ``cpu``
    is one CPU or a taskset list such as ``"0,1"``."""
    return cmd if cpu is None else ["taskset", "-c", str(cpu), *cmd]


def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Stop one child process by its PID (TERM, then KILL after 10 s)."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


class BenchCA(TestCA):
    """The upstream CA (``ca_pem`` is what proxies and direct clients trust) and one leaf for the
    nginx and SSE upstreams; tests/servers.Upstream issues its own leaf from the same CA."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        leaf = self.ca.issue_cert(*HOSTNAMES)
        self.cert_pem = tmp / "upstream-cert.pem"
        self.key_pem = tmp / "upstream-key.pem"
        leaf.private_key_pem.write_to_path(str(self.key_pem))
        with open(self.cert_pem, "wb") as f:  # leaf first, then the chain (nginx wants one file)
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())


def _nginx_conf(root: Path, port: int, ca: BenchCA) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""  # root's worker would run as nobody
    temps = "\n".join(
        f"    {kind}_temp_path {root / 'tmp' / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""{user}worker_processes 1;
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    server_tokens off;
{temps}
    keepalive_requests 1000000;  # hey keeps each connection for the whole run
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {ca.cert_pem};
        ssl_certificate_key {ca.key_pem};
        ssl_protocols TLSv1.2 TLSv1.3;
        location = /small {{
            default_type text/plain;
            add_header X-Upstream-Resumed $ssl_session_reused;  # bench/handshake.py counts it
            return 200 "{SMALL_BODY.decode()}";
        }}
        location /files/ {{  # a package, an archive, a model: binary
            default_type application/octet-stream;
            root {root / "www"};
        }}
        location /text/ {{  # the same bytes as text: escaped spellings are sought in it
            default_type text/plain;
            alias {root / "www" / "files"}/;
        }}
        location /json/ {{  # an API's JSON (JSON_RECORD repeated): text, dense in escapes
            default_type application/json;
            root {root / "www"};
        }}
    }}
}}
"""


class Nginx:
    """``GET /small``: 100 bytes; ``GET /files/big``: the 50 MB file (``/text/big``: the same as
    text/plain); ``GET /json/big``: 50 MB of JSON_RECORD as application/json."""

    def __init__(self, tmp: Path, ca: BenchCA, cpu: int | None) -> None:
        self.binary = shutil.which("nginx") or "/usr/sbin/nginx"  # sbin is not on every PATH
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError("nginx is not installed (make bench installs it: apt-get install nginx)")
        self.root = tmp / "nginx"
        self.port = free_port()
        self.cpu = cpu
        for sub in ("www/files", "tmp"):
            (self.root / sub).mkdir(parents=True)
        with open(self.root / "www" / "files" / "big", "wb") as f:
            block = bytes(range(256)) * 4096  # 1 MiB, incompressible enough and written once
            for _ in range(BIG_MB):
                f.write(block)
        (self.root / "www" / "json").mkdir()
        with open(self.root / "www" / "json" / "big", "wb") as f:
            block = (JSON_RECORD * (MIB // len(JSON_RECORD) + 1))[:MIB]
            for _ in range(BIG_MB):
                f.write(block)
        self.conf = self.root / "nginx.conf"
        self.conf.write_text(_nginx_conf(self.root, self.port, ca))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        cmd = [self.binary, "-p", str(self.root), "-c", str(self.conf), "-g", "daemon off;"]
        with open(self.root / "stderr", "wb") as err:
            self.proc = subprocess.Popen(pinned(cmd, self.cpu), stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_listening(self.port, self.proc, "nginx")
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{e}: {(self.root / 'stderr').read_text(errors='replace')}") from None
        return self

    def stop(self) -> None:
        stop(self.proc, signal.SIGQUIT)  # graceful: the master stops its worker, then exits


class SSEServer:
    """``GET /sse``: ``data: <n>`` every 100 ms for 2 s (chunked, keep-alive), TLS, same CA."""

    def __init__(self, tmp: Path, ca: BenchCA, cpu: int | None) -> None:
        self.port = free_port()
        self.cmd = pinned(
            [
                sys.executable,
                str(_SSE_SERVER),
                "--port",
                str(self.port),
                "--cert",
                str(ca.cert_pem),
                "--key",
                str(ca.key_pem),
                "--events",
                str(SSE_EVENTS),
                "--period",
                str(SSE_PERIOD_S),
            ],
            cpu,
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SSEServer:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, "the SSE server")
        return self

    def stop(self) -> None:
        stop(self.proc)
