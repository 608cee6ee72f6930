"""Soak: does a normal client keep working while 1,000 connections and a slowloris client sit on
the proxy? (issue 5: "cannot take the proxy down").

One run, side by side on this machine:

1. baseline: the normal client alone, for ``--seconds``;
2. soak: the same client while a separate load process holds ``--connections`` connections open
   through the proxy — half idle tunnels (CONNECT, TLS with the proxy, then silence), half slow
   tunnels dribbling a request head one byte every 2 s — plus one slowloris client on the proxy's
   port dribbling a plain request head byte by byte (every 100 ms), never finishing it.

The normal client does what an agent does: a fresh connection per request (CONNECT, TLS, GET
with a placeholder swapped for the credential) against a real HTTPS upstream (tests/servers.py)
on loopback, with a 10 s timeout. Printed: a markdown table of its success rate and p50/p99
latency per phase, how many of the load connections the proxy still held open at the end, and
the proxy's RSS and open file descriptors.

    .venv/bin/python bench/soak.py [--connections 1000] [--seconds 20] [--header-timeout S]

RLIMIT_NOFILE is raised to its hard limit (the proxy inherits it). Every process started here is
stopped by its PID. A benchmark script, not a test: it asserts nothing and prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing as mp
import os
import resource
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import httpx  # noqa: E402
from proxies import CLAIM, PLACEHOLDER, TOKEN, UPSTREAM_HOST, Surrogate, write_rules  # noqa: E402
from servers import TestCA, Upstream  # noqa: E402

AUTH = "Basic " + base64.b64encode(f"{CLAIM}:{TOKEN}".encode()).decode()


def raise_nofile(need: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- the normal client ------------------------------------------------------------------------


def normal_client(proxy_url: str, ca: Path, url: str, seconds: float) -> tuple[int, list[float]]:
    """Requests back to back for ``seconds``: (attempts, latencies in ms of the successful ones)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    attempts, ok = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        attempts += 1
        start = time.perf_counter()
        try:
            with httpx.Client(proxy=proxy_url, verify=ctx, timeout=10) as client:
                r = client.get(url, headers={"Authorization": f"Bearer {PLACEHOLDER}"})
            if r.status_code == 200:
                ok.append((time.perf_counter() - start) * 1000)
        except httpx.HTTPError:
            pass
    return attempts, ok


# -- the load process -------------------------------------------------------------------------


async def _tunnel(
    port: int, target: str, ctx: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {AUTH}\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(head[:40].decode(errors="replace"))
    await writer.start_tls(ctx, server_hostname=UPSTREAM_HOST)
    return reader, writer


async def _hold(
    port: int, target: str, ctx: ssl.SSLContext, slow: bool, stop: float, state: dict[str, int]
) -> None:
    try:
        reader, writer = await _tunnel(port, target, ctx)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        state["failed"] += 1
        return
    state["open"] += 1
    head = f"GET /slow HTTP/1.1\r\nHost: {target}\r\nX-Pad: {'a' * 4000}\r\n".encode()
    i = 0
    try:
        while time.monotonic() < stop:
            if slow and i < len(head):
                writer.write(head[i : i + 1])
                await writer.drain()
                i += 1
            try:
                if await asyncio.wait_for(reader.read(1), 2.0 if slow else 1.0) == b"":
                    break  # the proxy closed it
            except TimeoutError:
                continue
    except (OSError, ssl.SSLError):
        pass
    finally:
        state["open"] -= 1
        state["closed_by_proxy"] += time.monotonic() < stop
        writer.close()


async def _slowloris(port: int, stop: float, state: dict[str, int]) -> None:
    """Plain HTTP on the proxy's port, a request head one byte every 100 ms, never finished."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"GET http://{UPSTREAM_HOST}/loris HTTP/1.1\r\nProxy-Authorization: {AUTH}\r\n" + "X-A: b\r\n" * 5000
    ).encode()
    i = 0
    try:
        while time.monotonic() < stop and i < len(head):
            writer.write(head[i : i + 1])
            await writer.drain()
            i += 1
            await asyncio.sleep(0.1)
            if reader.at_eof():
                break
        state["loris_bytes"] = i
        state["loris_closed_by_proxy"] = int(time.monotonic() < stop)
    except OSError:
        state["loris_bytes"] = i
        state["loris_closed_by_proxy"] = 1
    finally:
        writer.close()


async def _load(port: int, target: str, ca: str, n: int, seconds: float, report: mp.Queue) -> None:  # type: ignore[type-arg]
    ctx = ssl.create_default_context(cafile=ca)
    state = {"open": 0, "failed": 0, "closed_by_proxy": 0, "loris_bytes": 0, "loris_closed_by_proxy": 0}
    stop = time.monotonic() + seconds
    tasks = [asyncio.create_task(_slowloris(port, stop, state))]
    for i in range(n):
        tasks.append(asyncio.create_task(_hold(port, target, ctx, i % 2 == 1, stop, state)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # a ramp, not a SYN flood
    await asyncio.sleep(max(0.0, stop - time.monotonic() - 1.0))
    report.put(("steady", dict(state)))
    await asyncio.gather(*tasks, return_exceptions=True)
    report.put(("end", dict(state)))


def load_process(port: int, target: str, ca: str, n: int, seconds: float, report: mp.Queue) -> None:  # type: ignore[type-arg]
    raise_nofile(n + 100)
    asyncio.run(_load(port, target, ca, n, seconds, report))


# -- the run ----------------------------------------------------------------------------------


def proc_stats(pid: int) -> tuple[int, int]:
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return rss // 1024, len(os.listdir(f"/proc/{pid}/fd"))


def row(name: str, attempts: int, ok: list[float]) -> str:
    if not ok:
        return f"| {name} | {attempts} | 0.0% | - | - |"
    q = statistics.quantiles(ok, n=100) if len(ok) > 1 else [ok[0]] * 99
    rate = 100 * len(ok) / attempts
    return f"| {name} | {attempts} | {rate:.1f}% | {statistics.median(ok):.1f} | {q[98]:.1f} |"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=20.0, help="length of each measured phase")
    p.add_argument(
        "--header-timeout",
        type=int,
        default=None,
        help="the proxy's --header-timeout (default: the proxy's own, 60 s, longer than a phase)",
    )
    args = p.parse_args()
    ramp = 2 + args.connections / 100  # seconds to open the load connections (TLS handshakes)
    limit = raise_nofile(2 * args.connections + 200)
    with tempfile.TemporaryDirectory(prefix="soak-") as d:
        tmp = Path(d)
        ca = TestCA(tmp)
        upstream = Upstream(ca, [UPSTREAM_HOST], tmpdir=tmp).start()
        proxy = Surrogate("surrogate", tmp / "proxy", write_rules(tmp, [upstream.port]), ca.ca_pem, None)
        if args.header_timeout is not None:
            proxy.process.args += ["--header-timeout", str(args.header_timeout)]
        try:
            proxy.start()
            target = f"{UPSTREAM_HOST}:{upstream.port}"
            proxy_url, proxy_ca = proxy.process.url(CLAIM, TOKEN), proxy.process.ca_pem
            url = f"https://{target}/ok"
            normal_client(proxy_url, proxy_ca, url, 2)  # warm-up: CA, certificate cache
            base = normal_client(proxy_url, proxy_ca, url, args.seconds)
            idle_stats = proc_stats(proxy.pid)
            spawn = mp.get_context("spawn")  # a fresh interpreter: no GIL shared with the measuring client
            report: mp.Queue = spawn.Queue()  # type: ignore[type-arg]
            loader = spawn.Process(
                target=load_process,
                args=(
                    proxy.process.port,
                    target,
                    str(proxy_ca),
                    args.connections,
                    ramp + args.seconds + 3,
                    report,
                ),
            )
            loader.start()
            time.sleep(ramp)  # the ramp: 1,000 CONNECTs and TLS handshakes
            soak = normal_client(proxy_url, proxy_ca, url, args.seconds)
            load_stats = proc_stats(proxy.pid)
            steady = report.get(timeout=60)[1]
            end = report.get(timeout=120)[1]
            loader.join(30)
            if loader.is_alive():
                loader.kill()
        finally:
            proxy.stop()
            upstream.stop()
    print(f"## Soak: {args.connections} held connections + 1 slowloris vs a normal client\n")
    print(
        f"RLIMIT_NOFILE {limit}; each phase {args.seconds:.0f} s; "
        "normal client: a fresh CONNECT+TLS+GET per request\n"
    )
    print("| phase | requests | success | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    print(row("idle baseline", *base))
    print(row(f"soak ({args.connections} conns + slowloris)", *soak))
    print()
    print("| load | value |")
    print("|---|---:|")
    print(f"| load connections open at steady state | {steady['open']} of {args.connections} |")
    print(f"| load connections refused or failed to open | {steady['failed']} |")
    print(f"| load connections closed by the proxy before the end | {end['closed_by_proxy']} |")
    print(
        f"| slowloris bytes sent / closed by the proxy | {end['loris_bytes']} / "
        f"{'yes' if end['loris_closed_by_proxy'] else 'no'} |"
    )
    print(f"| proxy RSS MiB / open fds, idle | {idle_stats[0]} / {idle_stats[1]} |")
    print(f"| proxy RSS MiB / open fds, under load | {load_stats[0]} / {load_stats[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
