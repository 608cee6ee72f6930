"""Idle tunnels (issue 19): hold K tunnels open through a proxy and see what each costs it.

A tunnel is what an idle keep-alive connection of a sandbox holds: TCP, ``CONNECT`` with
Proxy-Authorization, and the client's TLS handshake (verified) inside it, then nothing (no
request, so the lazy proxy opens no upstream connection). The client is asyncio on the load
core, ``IN_FLIGHT`` set-ups at a time. Measured: the proxy's RSS above its warmed-up idle RSS,
per tunnel (``/proc/PID/status`` VmRSS, read once every tunnel is up and again a second later);
the set-up rate (tunnels ÷ seconds from the first connect to the last handshake done).

surrogate closes a connection that waits longer than ``--header-timeout`` (default 60 s) for a
request head; 10,000 set-ups take longer than that on this machine, so the surrogate measured
here runs with ``--header-timeout 900`` (and pools allow 100,000 connections: bench/proxies.py).
Run alone: ``python bench/idle.py --tunnels 1000 10000``.

``--heap`` adds a third proxy, surrogate run under tracemalloc (bench/tracemem.py, one frame),
probed at idle and with every tunnel held: per tunnel, the Python heap (what tracemalloc traces,
in that run) beside the plain surrogate's RSS, so the rest is C: OpenSSL and glibc's malloc
overhead (its free chunks per tunnel shown apart, and what ``malloc_trim`` would hand back), and
the objects gc tracks that grew most, per tunnel.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from load import Target, status_kib  # noqa: E402

IN_FLIGHT = 32
HEADER_TIMEOUT = ["--header-timeout", "900"]


@dataclass(frozen=True, slots=True)
class Held:
    tunnels: int
    kib_per_tunnel: float
    setup_per_s: float
    idle_rss_mib: float
    kib_left_per_tunnel: float  # RSS above idle a second after every tunnel closed, per tunnel
    probes: tuple[dict[str, object], dict[str, object]] | None = None  # --heap: at idle, held


async def _probe(pid: int, out: Path) -> dict[str, object]:
    """bench/tracemem.py's SIGUSR2 probe of ``pid``, once written."""
    before = set(out.glob("probe-*.json"))
    os.kill(pid, signal.SIGUSR2)
    for _ in range(600):
        await asyncio.sleep(0.1)
        new = set(out.glob("probe-*.json")) - before
        if new:
            await asyncio.sleep(0.2)  # written whole
            got: dict[str, object] = json.loads(new.pop().read_text())
            return got
    raise RuntimeError("no probe written")


async def _open(target: Target, port: int, ctx: ssl.SSLContext) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", target.proxy_port())
    writer.write(
        f"CONNECT {target.host}:{port} HTTP/1.1\r\nHost: {target.host}:{port}\r\n"
        f"Proxy-Authorization: Basic {target.proxy_auth()}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{target.name} refused CONNECT: {head[:80]!r}")
    await writer.start_tls(ctx, server_hostname=target.host)
    return writer


async def _hold(target: Target, port: int, k: int, probe_dir: Path | None) -> Held:
    assert target.pid is not None
    ctx = ssl.create_default_context(cafile=str(target.ca_pem))
    ctx.set_alpn_protocols(["http/1.1"])
    warm = [await _open(target, port, ctx) for _ in range(5)]  # leaf certificate, first paths
    for w in warm:
        w.close()
    await asyncio.sleep(1.0)
    idle = status_kib(target.pid, "VmRSS")
    at_idle = None if probe_dir is None else await _probe(target.pid, probe_dir)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> asyncio.StreamWriter:
        async with gate:
            return await _open(target, port, ctx)

    t0 = time.perf_counter()
    held = await asyncio.gather(*(one() for _ in range(k)))
    seconds = time.perf_counter() - t0
    await asyncio.sleep(1.0)  # let the proxy finish what each handshake left to do
    rss = status_kib(target.pid, "VmRSS")
    probes = None
    if probe_dir is not None and at_idle is not None:
        (probe_dir / "trim").touch()
        probes = (at_idle, await _probe(target.pid, probe_dir))
        (probe_dir / "trim").unlink()
    for w in held:
        w.close()
    await asyncio.gather(*(w.wait_closed() for w in held), return_exceptions=True)
    await asyncio.sleep(1.0)
    after = status_kib(target.pid, "VmRSS")
    return Held(k, (rss - idle) / k, k / seconds, idle / 1024, (after - idle) / k, probes)


def hold(target: Target, port: int, k: int, probe_dir: Path | None = None) -> Held:
    """Open ``k`` idle tunnels through ``target``, measure, close them; with ``probe_dir`` (the
    target runs under bench/tracemem.py writing there), probe its heap at idle and held."""
    return asyncio.run(_hold(target, port, k, probe_dir))


def _main() -> int:
    from proxies import Mitmdump, Surrogate, write_rules
    from upstreams import BenchCA, Nginx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tunnels", type=int, nargs="+", default=[1000])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--heap", action="store_true", help="also surrogate under tracemalloc: heap vs RSS")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if max(args.tunnels) + 100 > hard:
        ap.error(f"the file-descriptor limit is {hard}: at most {hard - 100} tunnels")
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, load_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    load0 = os.getloadavg()
    got: dict[tuple[str, int], list[Held]] = {}
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="surrogate-bench-idle-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        ca = BenchCA(tmp)
        nginx = Nginx(tmp, ca, load_cpu).start()
        stack.callback(nginx.stop)
        rules = write_rules(tmp, [nginx.port])
        mitm = Mitmdump(tmp, ca.ca_pem, proxy_cpu).start()
        stack.callback(mitm.stop)
        surrogate = Surrogate("surrogate", tmp / "s", rules, ca.ca_pem, proxy_cpu)
        surrogate.process.args += HEADER_TIMEOUT
        surrogate.start()
        stack.callback(surrogate.stop)
        targets = [mitm.target(), surrogate.target()]
        probe_dirs: dict[str, Path] = {}
        if args.heap:
            traced = Surrogate("surrogate-traced", tmp / "t", rules, ca.ca_pem, proxy_cpu)
            at = traced.process.args.index("-m")  # python -m proxy run … → python tracemem.py DIR run …
            traced.process.args[at : at + 2] = [str(ROOT / "bench" / "tracemem.py"), str(tmp / "probes")]
            traced.process.args += HEADER_TIMEOUT
            traced.process.env["TRACEMEM_FRAMES"] = "1"
            traced.process.start(timeout=120)  # tracemalloc slows the start
            stack.callback(traced.stop)
            targets.append(traced.target())
            probe_dirs[traced.name] = tmp / "probes"
        for rnd in range(args.rounds):
            for k in args.tunnels:
                for t in targets if rnd % 2 == 0 else targets[::-1]:
                    print(f"round {rnd + 1}: {k:,} tunnels via {t.name}…", file=sys.stderr)
                    got.setdefault((t.name, k), []).append(hold(t, nginx.port, k, probe_dirs.get(t.name)))
    print(
        f"{args.rounds} round(s); {IN_FLIGHT} set-ups in flight; proxies on CPU {proxy_cpu}, client on "
        f"CPU {load_cpu}; load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end"
    )
    print(render(got))
    return 0


def render(got: dict[tuple[str, int], list[Held]]) -> str:
    lines = [
        "| target | tunnels | idle RSS | RSS per tunnel above idle | set-up rate | left after close |",
        "|---|---|---|---|---|---|",
    ]
    for (name, k), hs in sorted(got.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(
            f"| {name} | {k:,} | {statistics.median(h.idle_rss_mib for h in hs):.0f} MiB "
            f"| {statistics.median(h.kib_per_tunnel for h in hs):.1f} KiB "
            f"| {statistics.median(h.setup_per_s for h in hs):.0f}/s "
            f"| {statistics.median(h.kib_left_per_tunnel for h in hs):.1f} KiB |"
        )
        for h in hs[-1:]:
            if h.probes is not None:
                plain = got.get(("surrogate", k))
                rss = statistics.median(p.kib_per_tunnel for p in plain) if plain else None
                lines.extend(_heap(h.tunnels, *h.probes, rss))
    return "\n".join(lines)


def _heap(k: int, idle: dict[str, Any], held: dict[str, Any], plain_rss: float | None) -> list[str]:
    """Per tunnel, from two bench/tracemem.py probes: Python heap vs RSS, and the rest. The RSS
    split is the plain surrogate's (``plain_rss``; tracemalloc's own overhead is not all in its
    count), the heap the traced one's (exact: tracemalloc sees every Python allocation)."""

    def per(key: str) -> float:
        return (float(held[key]) - float(idle[key])) / k / 1024

    heap = per("traced")
    traced_rss = (held["rss_kib"] - idle["rss_kib"]) / k
    rss = traced_rss if plain_rss is None else plain_rss
    census = Counter(held["census"])
    census.subtract(idle["census"])
    grew = ", ".join(f"{name} {n / k:.1f}" for name, n in census.most_common(12))
    return [
        f"  {k:,} tunnels, per tunnel: surrogate's RSS {rss:.1f} KiB = Python heap {heap:.1f} KiB "
        f"(traced run) + C side {rss - heap:.1f} KiB (OpenSSL, malloc overhead); traced run: RSS "
        f"{traced_rss:.1f} KiB, tracemalloc's own {per('tracemalloc_overhead'):.1f} KiB, malloc in use "
        f"{per('malloc_in_use'):.1f} KiB, "
        f"free in its heaps {per('malloc_free'):.1f} KiB; malloc_trim would hand back "
        f"{(held['rss_kib'] - held['rss_kib_trimmed']) / k:.1f} KiB",
        f"  objects gc tracks, grown per tunnel: {grew}",
    ]


if __name__ == "__main__":
    raise SystemExit(_main())
