"""Held requests (issue 16): 100 concurrent held requests with 1 MiB bodies on claim A; claim B's
ordinary requests meanwhile, and the proxy's memory.

One real proxy (one process), a loopback HTTPS upstream (tests/servers.py), an ask rule on
``POST /upload`` for both claims of a pool. Measured:

- claim B: ``--requests`` sequential ``GET /ok`` (keep-alive, httpx) before the holds and while
  they are held: p50 / p99 latency, and the ratio during / before;
- the proxy's ``VmRSS`` and ``VmHWM`` (``/proc/PID/status``) idle (after B's warm-up, peak
  reset), with the 100 requests held (their clients blocked in their sends: each client writes
  its 1 MiB body in 64 KiB pieces as fast as the proxy takes them), and after every one was
  approved and its body forwarded (the upstream counts the bytes it received).

A script, not a timed test: ``python bench/approvals.py`` from the repo root (``--held``,
``--body``, ``--requests``). It prints the figures and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import httpx  # noqa: E402
from world import Stage, claim, control, credential, egress, rules  # noqa: E402

PH_A = "surr_BenchApprovalsClaimA0000001"
PH_B = "surr_BenchApprovalsClaimB0000001"
PIECE = 64 * 1024
SNDBUF = 64 * 1024  # the held clients' send buffers: what they get to send is what the proxy took


def _unread(port: int) -> int:
    """Bytes in the receive queues of the proxy's accepted loopback sockets (``/proc/net/tcp``):
    what clients sent that the proxy has not read."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port:
                    total += int(cols[4].split(":")[1], 16)
    return total


def _kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS


class Holds:
    """``n`` requests with ``size``-byte bodies on claim A, each on its own tunnel, sent from an
    asyncio loop in a thread of its own; ``sent`` counts body bytes the kernel took."""

    def __init__(self, proxy: Any, token: str, port: int, n: int, size: int) -> None:
        self.proxy, self.token, self.port, self.n, self.size = proxy, token, port, n, size
        self.sent = 0
        self.statuses: list[int] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.done = asyncio.run_coroutine_threadsafe(self._all(), self.loop)

    async def _all(self) -> None:
        await asyncio.gather(*(self._one(i) for i in range(self.n)))

    async def _one(self, i: int) -> None:
        ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
        ctx.set_alpn_protocols(["http/1.1"])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.proxy.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        auth = base64.b64encode(f"a:{self.token}".encode()).decode()
        authority = f"api.test:{self.port}"
        connect = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Basic {auth}"
        writer.write(connect.encode() + b"\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        await writer.start_tls(ctx, server_hostname="api.test")
        writer.write(
            f"POST /upload/{i} HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {PH_A}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {self.size}\r\n\r\n".encode()
        )
        piece = b"\xa5" * PIECE
        left = self.size
        while left:
            chunk = piece[: min(PIECE, left)]
            writer.write(chunk)
            await writer.drain()
            left -= len(chunk)
            self.sent += len(chunk)
        status = await reader.readuntil(b"\r\n")
        self.statuses.append(int(status.split()[1]))
        writer.close()


def _latencies(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        got = client.get(url)
        out.append((time.perf_counter() - t0) * 1000)
        assert got.status_code == 200, got.text
    return out


def _pcts(ms: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return q[49], q[98]


def _pending(proxy: Any, n: int, timeout: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout
    with control(proxy) as api:
        while time.monotonic() < deadline:
            ids = [a["id"] for a in api.get("/approvals").json() if a["claim_id"] == "a"]
            if len(ids) >= n:
                return ids
            time.sleep(0.2)
    raise RuntimeError(f"fewer than {n} approvals pending after {timeout} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--held", type=int, default=100)
    ap.add_argument("--body", type=int, default=1024 * 1024, help="bytes per held body")
    ap.add_argument("--requests", type=int, default=300, help="claim B's requests per phase")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="surrogate-bench-approvals-") as tmp, Stage(Path(tmp)) as st:
        token_a, token_b = st.token(file="token-a"), st.token(file="token-b")
        st.secret("a"), st.secret("b")
        up = st.upstream(["api.test"])
        limits = {"connections": 10_000, "requests_per_second": 100_000, "burst": 100_000}
        text = rules(
            [
                egress(
                    "api.test", up.port, approve={"methods": ["POST"], "paths": ["/upload"], "timeout": 600}
                )
            ],
            pool_extra={"limits": limits},
            claims=[
                claim("a", [credential("a", PH_A, ["api.test"])], token="file:token-a"),
                claim("b", [credential("b", PH_B, ["api.test"])], token="file:token-b"),
            ],
        )
        proxy = st.proxy(text, resolve=["api.test"], control=True)
        assert proxy.proc is not None
        pid = proxy.proc.pid
        url = f"https://api.test:{up.port}/ok"
        headers = {"Authorization": f"Bearer {PH_B}"}
        with httpx.Client(proxy=proxy.url("b", token_b), verify=str(proxy.ca_pem), headers=headers) as b:
            _latencies(b, url, 50)  # warm-up
            time.sleep(0.5)
            _reset_peak(pid)
            idle = _kib(pid)
            before = _latencies(b, url, args.requests)
            holds = Holds(proxy, token_a, up.port, args.held, args.body)
            ids = _pending(proxy, args.held)
            time.sleep(1.0)  # every client blocked in its send
            sent_held = holds.sent
            unread = _unread(proxy.port)
            during = _latencies(b, url, args.requests)
            held = _kib(pid)
            t0 = time.perf_counter()
            with control(proxy) as api:
                for i in ids:
                    assert api.post(f"/approvals/{i}/approve", json={"scope": "once"}).status_code == 200
            holds.done.result(timeout=300)
            resumed_s = time.perf_counter() - t0
            after = _kib(pid)
            holds.loop.call_soon_threadsafe(holds.loop.stop)
        received = sum(r.body_len for r in list(up.requests) if r.path.startswith("/upload/"))
        p50b, p99b = _pcts(before)
        p50d, p99d = _pcts(during)
        mib = 1024
        print(f"held: {args.held} requests x {args.body:,} B on claim A; claim B: {args.requests} GETs/phase")
        print(f"claim B latency before: p50 {p50b:.2f} ms  p99 {p99b:.2f} ms")
        print(f"claim B latency during: p50 {p50d:.2f} ms  p99 {p99d:.2f} ms")
        print(f"ratio during/before: p50 {p50d / p50b:.2f}x  p99 {p99d / p99b:.2f}x")
        print(f"held clients' body bytes taken while held: {sent_held:,} of {args.held * args.body:,} "
              f"({sent_held / args.held / 1024:.0f} KiB per request, client SO_SNDBUF {SNDBUF // 1024} KiB); "
              f"unread in the proxy's socket receive queues: {unread:,} B")  # fmt: skip
        print(f"proxy RSS idle {idle['VmRSS'] / mib:.1f} MiB; held {held['VmRSS'] / mib:.1f} MiB "
              f"(+{(held['VmRSS'] - idle['VmRSS']) / args.held:.0f} KiB per held request); "
              f"after resume {after['VmRSS'] / mib:.1f} MiB")  # fmt: skip
        print(f"proxy VmHWM while held {held['VmHWM'] / mib:.1f} MiB; "
              f"after resume {after['VmHWM'] / mib:.1f} MiB; "
              f"ratio held/idle RSS {held['VmRSS'] / idle['VmRSS']:.2f}x")  # fmt: skip
        print(f"approved and forwarded in {resumed_s:.1f} s: upstream received {received:,} B "
              f"(expected {args.held * args.body:,}); statuses {sorted(set(holds.statuses))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
