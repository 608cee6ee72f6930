"""Benchmarks for the main job (not timed tests: these machines are shared and noisy).

Prints, measured side by side in one run:
1. peak RSS growth of the proxy process while 200 MB stream through it (target < 20 MB);
2. time to the first SSE event, direct and through the proxy (median of N rounds, interleaved);
3. the header scan's cost with 1 and with 10,000 registered placeholders (it must not grow);
4. the control API: a PATCH acknowledged, then the next proxied request on an open keep-alive
   tunnel carries the new value (how often, and how long), and API writes per second.

Run: ``make bench`` (or ``.venv/bin/python bench/run.py [--rounds N] [--mb N]``).
Everything runs on loopback: a Python HTTPS upstream with a test CA, the proxy as its own process.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
from harness import ProxyProcess  # noqa: E402
from servers import TestCA, Upstream  # noqa: E402

from proxy import placeholders  # noqa: E402
from proxy.hosts import HostPattern  # noqa: E402
from proxy.policy import Credential  # noqa: E402
from proxy.secrets import ValueSource  # noqa: E402
from proxy.substitute import substitute_request  # noqa: E402


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def first_event_ms(
    port: int, host: str, upstream: Upstream, ca: Path, proxy: tuple[int, str] | None
) -> float:
    """Milliseconds from sending the request to reading the first SSE event."""
    upstream.sse_release.clear()
    t0 = time.perf_counter()
    if proxy:
        raw = socket.create_connection(("127.0.0.1", proxy[0]))
        raw.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: Basic {proxy[1]}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    else:
        raw = socket.create_connection(("127.0.0.1", port))
    tls = ssl.create_default_context(cafile=str(ca)).wrap_socket(raw, server_hostname=host)
    tls.sendall(f"GET /sse HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    buf = b""
    while b"data: one" not in buf:
        chunk = tls.recv(65536)
        if not chunk:
            raise RuntimeError("stream ended before the first event")
        buf += chunk
    elapsed = (time.perf_counter() - t0) * 1000
    upstream.sse_release.set()
    tls.close()
    return elapsed


def scan_cost_us(registered: int) -> float:
    tmp = Path(tempfile.mkdtemp())
    (tmp / "v").write_text("x")
    source = ValueSource.parse("file:v", tmp)
    creds = {}
    for _ in range(registered):
        ph = placeholders.generate()
        creds[ph.encode()] = Credential("c", ph, (HostPattern.parse("api.test"),), source)
    fields = [
        (b"Host", b"api.test"),
        (b"User-Agent", b"bench/1.0"),
        (b"Accept", b"*/*"),
        (b"Authorization", b"Bearer " + placeholders.generate().encode()),
        (b"X-Trace", b"surr_notregistered0000000000000"),
    ]
    n = 20000
    t = timeit.timeit(lambda: substitute_request(fields, b"/v1/x?y=1", "api.test", True, creds, ()), number=n)
    return t / n * 1e6


def control_rows(proxy: ProxyProcess, upstream: Upstream, n: int) -> list[tuple[str, str, str]]:
    """PATCH a value, then send the next request on an already-open tunnel: did it carry it?"""
    api = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(proxy.state_dir / "control.sock")), base_url="http://c"
    )
    token = api.post("/v1/claims", json={"id": "bench", "pool": "p"}).json()["proxy_token"]
    body = {"hosts": ["api.test"], "value": "v0"}
    ph = api.put("/v1/claims/bench/credentials/k", json=body).json()["placeholder"]
    ctx = ssl.create_default_context(cafile=str(proxy.ca_pem))
    client = httpx.Client(proxy=proxy.url("bench", token), verify=ctx)
    client.get(f"https://api.test:{upstream.port}/warm", headers={"X-Key": ph})
    seen, lat = 0, []
    for i in range(1, n + 1):
        t0 = time.perf_counter()
        api.patch("/v1/claims/bench/credentials/k", json={"value": f"value{i}"}).raise_for_status()
        client.get(f"https://api.test:{upstream.port}/b/{i}", headers={"X-Key": ph})
        lat.append((time.perf_counter() - t0) * 1000)
        sent = [v for r in upstream.requests if r.path == f"/b/{i}" for k, v in r.headers if k == "X-Key"]
        seen += sent == [f"value{i}"]
    t0, writes = time.perf_counter(), 0
    while time.perf_counter() - t0 < 2.0:
        api.patch("/v1/claims/bench/credentials/k", json={"value": f"w{writes}"}).raise_for_status()
        writes += 1
    rate = writes / (time.perf_counter() - t0)
    client.close()
    api.close()
    lat.sort()
    return [
        (
            "API write, then the next request on an open tunnel carries it",
            f"{seen}/{n}",
            "PATCH acked, then GET",
        ),
        ("API write + next proxied request, median", f"{lat[n // 2]:.1f} ms", f"max {lat[-1]:.1f} ms"),
        (
            "API writes per second (sequential PATCH over the socket)",
            f"{rate:.0f}/s",
            "SQLite WAL, synchronous=FULL",
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mb", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="surrogate-bench-"))
    ca = TestCA(tmp)
    upstream = Upstream(ca, ["api.test"], tmpdir=tmp).start()
    (tmp / "token").write_text("benchtoken\n")
    (tmp / "secret").write_text(f"BENCH{secrets.token_hex(8)}\n")
    rules = tmp / "rules.yaml"
    rules.write_text(
        textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            egress:
              - host: api.test
                ports: [{upstream.port}]
        claims:
          - id: c
            pool: p
            proxy_token: file:token
            credentials:
              - name: k
                value: file:secret
                placeholder: surr_BenchPlaceholder000000001
                hosts: [api.test]
        """)
    )
    proxy = ProxyProcess(rules, tmp, upstream_ca=ca.ca_pem, resolve={"api.test": "127.0.0.1"}).start()
    rows: list[tuple[str, str, str]] = []
    try:
        assert proxy.proc is not None
        pid = proxy.proc.pid
        curl = [
            "curl",
            "-sS",
            "-x",
            proxy.url("c", "benchtoken"),
            "--cacert",
            str(proxy.ca_pem),
            "-H",
            "Authorization: Bearer surr_BenchPlaceholder000000001",
            "-o",
            os.devnull,
            "-w",
            "%{size_download} %{speed_download}",
        ]
        subprocess.run(
            [*curl, f"https://api.test:{upstream.port}/bytes/1048576"], check=True, capture_output=True
        )  # warm up: CA leaf cert, imports, first connection
        base = kib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
        n = args.mb * 1024 * 1024
        out = subprocess.run(
            [*curl, f"https://api.test:{upstream.port}/bytes/{n}"], check=True, capture_output=True, text=True
        ).stdout.split()
        assert int(out[0]) == n, out
        growth = (kib(pid, "VmHWM") - base) / 1024
        rows.append(
            (
                f"peak RSS growth, {args.mb} MB download",
                f"{growth:.1f} MB",
                f"target < 20 MB; baseline RSS {base / 1024:.0f} MB, {float(out[1]) / 1e6:.0f} MB/s",
            )
        )

        import base64

        auth = base64.b64encode(b"c:benchtoken").decode()
        direct, proxied = [], []
        for _ in range(args.rounds):
            direct.append(first_event_ms(upstream.port, "api.test", upstream, ca.ca_pem, None))
            proxied.append(
                first_event_ms(upstream.port, "api.test", upstream, proxy.ca_pem, (proxy.port, auth))
            )
        d, p = statistics.median(direct), statistics.median(proxied)
        rows.append(("time to first SSE event, direct", f"{d:.1f} ms", f"median of {args.rounds}"))
        rows.append(
            (
                "time to first SSE event, via surrogate",
                f"{p:.1f} ms",
                f"{p / d:.1f}x direct (includes CONNECT + a second TLS handshake)",
            )
        )
        rows += control_rows(proxy, upstream, args.rounds * 10)
    finally:
        proxy.stop()
        upstream.stop()
    one, many = scan_cost_us(1), scan_cost_us(10_000)
    rows.append(("header scan + swap, 1 placeholder registered", f"{one:.1f} µs", "per request, 5 headers"))
    rows.append(
        (
            "header scan + swap, 10,000 registered",
            f"{many:.1f} µs",
            f"{many / one:.2f}x the 1-placeholder cost",
        )
    )
    print("| measure | value | note |\n|---|---|---|")
    for r in rows:
        print(f"| {' | '.join(r)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
