"""Load generators and probes: hey (small requests), curl (large downloads), a raw SSE client,
and what /proc says about a process (CPU time, RSS, peak RSS).

hey 0.1.x gives each worker (``-c``) its own keep-alive connection, sends ``-x`` proxy
credentials on CONNECT, and never verifies TLS (``InsecureSkipVerify`` is hard-coded in its
requester): fine for load, since what the proxies forward is checked by the test suite. curl and
the SSE client do verify, against the CA of whatever they talk to.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from upstreams import pinned

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` of ``pid`` and of every process descended from it now (``--workers``
    children), from /proc/PID/task/TID/children (Linux 3.5+). A child that exited is not counted."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone between the listing and the read
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy so far: the ``cpu`` line of /proc/stat
    (proc(5)), user + nice + system + irq + softirq + steal, in ``CLK_TCK`` ticks; idle and
    iowait are the rest. Counts every process, the bench's load generators and upstreams too."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS


@dataclass(frozen=True, slots=True)
class Target:
    """How a client reaches the upstreams: directly, or through a proxy."""

    name: str
    host: str  # the name in URLs (and in CONNECT)
    ca_pem: Path  # what a verifying client must trust
    proxy_url: str | None = None  # http://user:pass@127.0.0.1:PORT
    pid: int | None = None  # the proxy process, for CPU and RSS
    resolve: bool = False  # direct curl must be told where `host` is

    def proxy_auth(self) -> str | None:
        if self.proxy_url is None:
            return None
        u = urlsplit(self.proxy_url)
        return base64.b64encode(f"{u.username}:{u.password}".encode()).decode()

    def proxy_port(self) -> int:
        assert self.proxy_url is not None
        return int(urlsplit(self.proxy_url).port or 0)


@dataclass(frozen=True, slots=True)
class HeyResult:
    requests: int  # responses with status 200
    others: int  # other statuses and errors
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float | None  # the proxy's, when there is one
    # for the --workers rows: CPU seconds over the run, of the proxy with its children (None when
    # direct) and of the whole machine (hey, nginx, the kernel and the proxy), and its wall seconds
    proxy_tree_cpu_s: float | None = None
    machine_busy_s: float = 0.0
    wall_s: float = 0.0


_LATENCY = re.compile(r"^\s*(\d+)% in ([\d.]+) secs", re.M)
_STATUS = re.compile(r"^\s*\[(\d+)\]\s+(\d+) responses", re.M)
_ERROR = re.compile(r"^\s*\[(\d+)\]\t", re.M)


def hey(
    target: Target, url: str, concurrency: int, seconds: float, headers: list[str], cpu: int | str | None
) -> HeyResult:
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-disable-compression"]
    if target.proxy_url:
        cmd += ["-x", target.proxy_url]
    for h in headers:
        cmd += ["-H", h]
    before = cpu_seconds(target.pid) if target.pid else 0.0
    tree_before = tree_cpu_seconds(target.pid) if target.pid else 0.0
    busy_before, wall_before = machine_busy_seconds(), time.perf_counter()
    out = subprocess.run(pinned([*cmd, url], cpu), capture_output=True, text=True, check=True).stdout
    time.sleep(0.2)  # let the proxy finish closing hey's connections: that work is per run too
    used = cpu_seconds(target.pid) - before if target.pid else None
    tree_used = tree_cpu_seconds(target.pid) - tree_before if target.pid else None
    busy, wall = machine_busy_seconds() - busy_before, time.perf_counter() - wall_before
    status_part, _, error_part = out.partition("Error distribution:")
    statuses = {int(code): int(n) for code, n in _STATUS.findall(status_part)}
    errors = sum(int(n) for n in _ERROR.findall(error_part))
    pct = {int(p): float(s) * 1000 for p, s in _LATENCY.findall(out)}
    if 99 not in pct and (slowest := re.search(r"Slowest:\s+([\d.]+) secs", out)):
        # hey prints no p99 under 100 responses; the nearest-rank p99 of so few is the slowest
        pct[99] = float(slowest[1]) * 1000
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    ok = statuses.get(200, 0)
    if ok == 0 or rps is None or 50 not in pct or 99 not in pct:
        raise RuntimeError(f"hey via {target.name} got no 200 responses:\n{out}")
    answered = sum(statuses.values())
    return HeyResult(
        requests=ok,
        others=answered - ok + errors,
        rps=float(rps[1]) * ok / (answered + errors),  # only what succeeded counts
        p50_ms=pct[50],
        p99_ms=pct[99],
        cpu_us_per_req=None if used is None else used / answered * 1e6,
        proxy_tree_cpu_s=tree_used,
        machine_busy_s=busy,
        wall_s=wall,
    )


@dataclass(frozen=True, slots=True)
class Download:
    mb_per_s: float
    rss_growth_mb: float | None


def download(
    target: Target, url: str, times: int, expect_bytes: int, cpu: int | None, flags: list[str] | None = None
) -> Download:
    """``times`` sequential downloads of ``url`` by one curl (one keep-alive connection); ``flags``
    such as ``--http1.1`` (curl's default toward a TLS peer offering h2 is HTTP/2)."""
    cmd = ["curl", "-sS", "--fail", "--cacert", str(target.ca_pem), "-w", "%{size_download} %{time_total}\n"]
    cmd += flags or []
    if target.proxy_url:
        cmd += ["-x", target.proxy_url]
    elif target.resolve:
        port = urlsplit(url).port
        cmd += ["--resolve", f"{target.host}:{port}:127.0.0.1"]
    for _ in range(times):
        cmd += ["-o", os.devnull, url]
    base = 0
    if target.pid:
        base = status_kib(target.pid, "VmRSS")
        reset_peak_rss(target.pid)
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, check=True).stdout
    growth = (status_kib(target.pid, "VmHWM") - base) / 1024 if target.pid else None
    rows = [line.split() for line in out.splitlines()]
    got = [int(r[0]) for r in rows]
    if got != [expect_bytes] * times:
        raise RuntimeError(f"download via {target.name}: got {got} bytes, expected {times} x {expect_bytes}")
    seconds = sum(float(r[1]) for r in rows)
    return Download(sum(got) / seconds / 1e6, growth)


@dataclass(frozen=True, slots=True)
class SSEResult:
    first_ms: float  # from TCP connect to the first complete event
    tls_up_ms: float  # from TCP connect to the client's TLS handshake done (CONNECT included)
    first_after_request_ms: float  # from the request sent (TLS already up) to the first event
    spread_ms: float  # RMS deviation of the inter-arrival gaps from the nominal period
    events: int


def sse(target: Target, port: int, expect: int, period_s: float) -> SSEResult:
    """Read ``expect`` events of one stream with a raw socket, timing each as it completes."""
    t0 = time.perf_counter()
    if target.proxy_url:
        raw = socket.create_connection(("127.0.0.1", target.proxy_port()))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.sendall(
            f"CONNECT {target.host}:{port} HTTP/1.1\r\nHost: {target.host}:{port}\r\n"
            f"Proxy-Authorization: Basic {target.proxy_auth()}\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = raw.recv(4096)
            if not chunk:
                raise RuntimeError(f"{target.name} closed the CONNECT")
            reply += chunk
        if not reply.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{target.name} refused CONNECT: {reply[:100]!r}")
    else:
        raw = socket.create_connection(("127.0.0.1", port))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctx = ssl.create_default_context(cafile=str(target.ca_pem))
    with ctx.wrap_socket(raw, server_hostname=target.host) as tls:
        t_req = time.perf_counter()
        tls.sendall(
            f"GET /sse HTTP/1.1\r\nHost: {target.host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        buf, arrivals = b"", []
        while len(arrivals) < expect:
            chunk = tls.recv(65536)
            if not chunk:
                break
            now = time.perf_counter()
            buf += chunk
            done = buf.count(b"\n\n")  # each event ends with a blank line; chunk framing uses \r\n
            arrivals += [now] * (done - len(arrivals))
    if len(arrivals) < expect:
        raise RuntimeError(f"SSE via {target.name}: {len(arrivals)} of {expect} events")
    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False)]
    nominal = period_s * 1000
    spread = (sum((g - nominal) ** 2 for g in gaps) / len(gaps)) ** 0.5 if gaps else 0.0
    return SSEResult(
        (arrivals[0] - t0) * 1000, (t_req - t0) * 1000, (arrivals[0] - t_req) * 1000, spread, len(arrivals)
    )
