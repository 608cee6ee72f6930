"""Benchmark surrogate against a direct connection and bare mitmdump (issue 7), on loopback.

Upstreams (bench/upstreams.py): nginx with a trustme CA (a 100-byte response, a 50 MB file)
and a tiny asyncio SSE server (an event every 100 ms for 2 s); tests/servers.Upstream for the
control-API measurement, since it records what it received. Proxies (bench/proxies.py): bare
mitmdump and surrogate (tests/harness.ProxyProcess, full chain, one credential swapped per
request), plus a second surrogate whose control API holds a claim with 1 and a claim with 10,000
credentials. Every proxy runs pinned to one core; load generators, upstreams and this script to
the other.

Measured in interleaved rounds (target order rotated each round), medians reported:
1. hey at c=1, 16 and 64: requests/s, p50/p99 latency, proxy CPU µs per request
   (/proc/PID/stat utime+stime over the run ÷ responses);
2. 5 × 50 MB through one curl: MB/s, and the proxy's peak RSS growth (VmHWM reset first); the
   file is served as application/octet-stream (a package, an archive), and once more to surrogate
   as text/plain, where the scrubber also seeks escaped spellings (proxy/scrub.escapes_matter);
   each through the proxies over HTTP/2 (curl's default) and again with ``--http1.1`` (issue 19;
   bench/download.py measures that split alone, against main's surrogate too);
3. SSE through a raw client: time to the first event, spread of inter-arrival gaps vs 100 ms;
4. surrogate req/s at c=16 with a 1-credential vs a 10,000-credential claim (ABBA, half-length
   runs), the header scan's in-process cost with 1 vs 10,000 registered, and the registration;
5. a control-API write, then the next request on an open tunnel carries it; writes per second
   (on the plain surrogate, and again on the one holding 10,000 credentials);
6. ``--workers 2`` against ``--workers 1`` at c=64 (ABBA runs), both unpinned and sharing every
   core with hey, as a proxy would share a machine with its load;
7. new connections (bench/handshake.py): N fresh CONNECT + TLS + one request each, p50/p99 and
   the proxy's CPU per connection, for direct, mitmdump, surrogate (its new state dir: an EC
   CA) and a surrogate whose state dir holds an RSA CA; surrogate once more offering the previous
   connection's TLS session (resumption);
8. after the rounds, idle tunnels (bench/idle.py): 10,000 (quick: 1,000) CONNECT + client TLS
   held through mitmdump and surrogate, RSS per tunnel above idle and the set-up rate.

Run: ``make bench`` (about 5 minutes), or ``.venv/bin/python bench/run.py --quick`` (~1 minute,
fewer placeholders and shorter runs: a smoke test, not numbers to quote).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import handshake  # noqa: E402
import idle  # noqa: E402
from control import register_claim, write_then_request  # noqa: E402
from load import Target, download, hey, sse  # noqa: E402
from proxies import PLACEHOLDER, UPSTREAM_HOST, Mitmdump, Surrogate, write_rules  # noqa: E402
from report import DIRECT, MITMDUMP, SURROGATE, SURROGATE_RSA, Results, render  # noqa: E402
from scan import scan_cost_us  # noqa: E402
from servers import Upstream  # noqa: E402
from upstreams import BIG_BYTES, SSE_EVENTS, SSE_PERIOD_S, BenchCA, Nginx, SSEServer  # noqa: E402

CONCURRENCY = (1, 16, 64)
WORKERS = (1, 2)  # `surrogate run --workers N` compared at WORKERS_C
WORKERS_C = 64


def _cores() -> tuple[int | None, int | None]:
    """(proxy core, load core): the first two CPUs this process may use, or no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("warning: fewer than 2 CPUs: proxies and load share a core", file=sys.stderr)
        return None, None
    return cpus[0], cpus[1]


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3; quick 2)")
    ap.add_argument("--seconds", type=float, help="duration of each hey run (default 4; quick 1)")
    ap.add_argument(
        "--placeholders", type=int, help="credentials on the large claim (default 10,000; quick 1,000)"
    )
    ap.add_argument("--downloads", type=int, help="50 MB downloads per round and proxy (default 5; quick 2)")
    ap.add_argument("--connections", type=int, help="fresh connections per target and round (default 100)")
    ap.add_argument("--tunnels", type=int, help="idle tunnels held per proxy (default 10,000; quick 1,000)")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.seconds = args.seconds or (1.0 if args.quick else 4.0)
    args.placeholders = args.placeholders or (1_000 if args.quick else 10_000)
    args.downloads = args.downloads or (2 if args.quick else 5)
    args.connections = args.connections or (20 if args.quick else 100)
    args.tunnels = args.tunnels or (1_000 if args.quick else 10_000)
    if args.rounds < 1 or args.seconds <= 0 or args.placeholders < 2 or args.downloads < 1:
        ap.error("--rounds, --seconds, --downloads must be positive and --placeholders at least 2")
    return args


def _rotate(items: list[Target], by: int) -> list[Target]:
    by %= len(items)
    return items[by:] + items[:by]


@dataclass
class Bench:
    """Everything started for one run, and the URLs each target is loaded with."""

    sse_port: int
    recorder: Upstream
    surrogate: Surrogate
    sized: Surrogate
    targets: list[Target]
    small: dict[str, str]  # target name -> the 100-byte URL
    big: dict[str, str]  # target name -> the 50 MB URL
    by_count: dict[int, tuple[Target, str]]  # placeholders in the claim -> (its target, a placeholder)
    load_cpu: int | None
    by_workers: dict[int, Target]  # --workers N -> its (unpinned) surrogate
    every_cpu: str  # taskset list of every CPU: the workers comparison shares them all
    nginx_port: int
    handshake_targets: list[Target]  # direct, mitmdump, surrogate (EC CA), surrogate (RSA CA)


def _start(
    stack: ExitStack,
    tmp: Path,
    cpus: tuple[int | None, int | None, str],
    args: argparse.Namespace,
    results: Results,
) -> Bench:
    proxy_cpu, load_cpu, every_cpu = cpus
    ca = BenchCA(tmp)
    nginx = stack.enter_context(_stopping(Nginx(tmp, ca, load_cpu).start()))
    sse_server = stack.enter_context(_stopping(SSEServer(tmp, ca, load_cpu).start()))
    recorder = stack.enter_context(_stopping(Upstream(ca, [UPSTREAM_HOST], tmpdir=tmp).start()))
    rules = write_rules(tmp, [nginx.port, sse_server.port, recorder.port])
    mitm = stack.enter_context(_stopping(Mitmdump(tmp, ca.ca_pem, proxy_cpu).start()))
    surrogate = Surrogate(SURROGATE, tmp / "surrogate", rules, ca.ca_pem, proxy_cpu)
    surrogate.process.args += idle.HEADER_TIMEOUT  # 10,000 idle tunnels take longer than 60 s to open
    surrogate = stack.enter_context(_stopping(surrogate.start()))
    handshake.rsa_state_dir(tmp / "rsa")
    rsa = Surrogate(SURROGATE_RSA, tmp / "rsa", rules, ca.ca_pem, proxy_cpu)
    rsa = stack.enter_context(_stopping(rsa.start()))
    sized = Surrogate("surrogate-sized", tmp / "sized", rules, ca.ca_pem, proxy_cpu)
    sized = stack.enter_context(_stopping(sized.start()))
    by_workers = {}
    for n in WORKERS:
        w = Surrogate(f"surrogate-{n}w", tmp / f"workers{n}", rules, ca.ca_pem, every_cpu, workers=n)
        by_workers[n] = stack.enter_context(_stopping(w.start())).target()

    print(f"registering {args.placeholders:,} credentials through the control API…", file=sys.stderr)
    one = register_claim(sized, "one", 1)
    many = results.registered = register_claim(sized, "many", args.placeholders)
    targets = [Target(DIRECT, UPSTREAM_HOST, ca.ca_pem, resolve=True), mitm.target(), surrogate.target()]
    return Bench(
        sse_port=sse_server.port,
        recorder=recorder,
        surrogate=surrogate,
        sized=sized,
        targets=targets,
        small={  # hey cannot be told where api.test is: direct and mitmdump dial the address
            DIRECT: f"https://127.0.0.1:{nginx.port}/small",
            MITMDUMP: f"https://127.0.0.1:{nginx.port}/small",
            SURROGATE: f"https://{UPSTREAM_HOST}:{nginx.port}/small",
        },
        big={t.name: f"https://{t.host}:{nginx.port}/files/big" for t in targets},
        by_count={
            1: (sized.target("one", one.token), one.placeholder),
            args.placeholders: (sized.target("many", many.token), many.placeholder),
        },
        load_cpu=load_cpu,
        by_workers=by_workers,
        every_cpu=every_cpu,
        nginx_port=nginx.port,
        handshake_targets=[*targets, rsa.target()],
    )


class _Stoppable(Protocol):
    def stop(self) -> None: ...


@contextmanager
def _stopping[S: _Stoppable](thing: S) -> Iterator[S]:
    try:
        yield thing
    finally:
        thing.stop()


def _bearer(placeholder: str) -> list[str]:
    return [f"Authorization: Bearer {placeholder}"]


def _warm_up(b: Bench) -> None:
    """Leaf certificates, imports, first connections, the large claim's index."""
    for t in b.targets:
        hey(t, b.small[t.name], 16, 1, _bearer(PLACEHOLDER), b.load_cpu)
        download(t, b.big[t.name], 1, BIG_BYTES, b.load_cpu)
        sse(t, b.sse_port, 1, SSE_PERIOD_S)
    for target, placeholder in b.by_count.values():
        hey(target, b.small[SURROGATE], 16, 1, _bearer(placeholder), b.load_cpu)
    for target in b.by_workers.values():
        hey(target, b.small[SURROGATE], WORKERS_C, 1, _bearer(PLACEHOLDER), b.every_cpu)
    for target in b.handshake_targets:
        handshake.run(target, b.nginx_port, 5, False)


def _round(b: Bench, rnd: int, args: argparse.Namespace, results: Results) -> None:
    order = _rotate(b.targets, rnd)
    for c in CONCURRENCY:
        for t in order:
            run = hey(t, b.small[t.name], c, args.seconds, _bearer(PLACEHOLDER), b.load_cpu)
            results.hey.setdefault((t.name, c), []).append(run)
    small_n, large_n = sorted(b.by_count)
    for n in (small_n, large_n, large_n, small_n):  # ABBA, half-length runs: drift cancels
        target, placeholder = b.by_count[n]
        run = hey(target, b.small[SURROGATE], 16, args.seconds / 2, _bearer(placeholder), b.load_cpu)
        results.by_count.setdefault(n, []).append(run)
    one, two = WORKERS
    for n in (one, two, two, one) if rnd % 2 == 0 else (two, one, one, two):  # ABBA, alternating
        run = hey(
            b.by_workers[n], b.small[SURROGATE], WORKERS_C, args.seconds, _bearer(PLACEHOLDER), b.every_cpu
        )
        results.workers.setdefault(n, []).append(run)
    for t in order:
        got = download(t, b.big[t.name], args.downloads, BIG_BYTES, b.load_cpu)
        results.downloads.setdefault(t.name, []).append(got)
    surrogate = next(t for t in order if t.name == SURROGATE)
    text_url = b.big[SURROGATE].replace("/files/", "/text/")
    results.text_downloads.append(download(surrogate, text_url, args.downloads, BIG_BYTES, b.load_cpu))
    for t in order:  # the same over HTTP/1.1 toward curl (above: HTTP/2 through the proxies)
        if t.name != DIRECT:  # nginx speaks HTTP/1.1 only: the direct row above is already that
            got = download(t, b.big[t.name], args.downloads, BIG_BYTES, b.load_cpu, ["--http1.1"])
            results.h1_downloads.setdefault(t.name, []).append(got)
    h1_text = download(surrogate, text_url, args.downloads, BIG_BYTES, b.load_cpu, ["--http1.1"])
    results.h1_text_downloads.append(h1_text)
    for t in order:
        results.sse.setdefault(t.name, []).append(sse(t, b.sse_port, SSE_EVENTS, SSE_PERIOD_S))
    for t in _rotate(b.handshake_targets, rnd):
        fresh = handshake.run(t, b.nginx_port, args.connections, False)
        results.handshakes.setdefault((t.name, False), []).append(fresh)
    resumed = handshake.run(surrogate, b.nginx_port, args.connections, True)
    results.handshakes.setdefault((SURROGATE, True), []).append(resumed)


def _idle(b: Bench, args: argparse.Namespace, results: Results) -> None:
    """Idle tunnels, once: mitmdump then surrogate (each closes its tunnels before the next)."""
    for t in b.targets:
        if t.pid is not None:
            print(f"{args.tunnels:,} idle tunnels via {t.name}…", file=sys.stderr)
            results.idle[t.name] = idle.hold(t, b.nginx_port, args.tunnels)


def main() -> int:
    args = _args()
    for tool in ("hey", "curl", "taskset"):
        if shutil.which(tool) is None:
            print(f"error: {tool} is not installed (make bench installs nginx and hey)", file=sys.stderr)
            return 1
    t_start, load_before = time.monotonic(), os.getloadavg()[0]
    every_cpu = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    results = Results(CONCURRENCY, placeholders=args.placeholders, tunnels=args.tunnels)
    results.cores = len(every_cpu.split(","))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if args.tunnels + 200 > hard:
        print(f"error: the file-descriptor limit is {hard}: --tunnels at most {hard - 200}", file=sys.stderr)
        return 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the client end of every idle tunnel
    proxy_cpu, load_cpu = _cores()
    if load_cpu is not None:  # before any thread starts: the SSE client, API calls, recorder upstream
        os.sched_setaffinity(0, {load_cpu})
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="surrogate-bench-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        bench = _start(stack, tmp, (proxy_cpu, load_cpu, every_cpu), args, results)
        print("warming up…", file=sys.stderr)
        _warm_up(bench)
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}…", file=sys.stderr)
            _round(bench, rnd, args, results)
        _idle(bench, args, results)
        results.server_handshake_us = {
            SURROGATE: handshake.server_handshake_us(tmp / "surrogate" / "state"),
            SURROGATE_RSA: handshake.server_handshake_us(tmp / "rsa" / "state"),
        }
        print("control API…", file=sys.stderr)
        results.control = write_then_request(bench.surrogate, bench.recorder, 70)
        results.control_sized = write_then_request(bench.sized, bench.recorder, 30)
    results.scan_us = {1: scan_cost_us(1), args.placeholders: scan_cost_us(args.placeholders)}

    pinning = (
        f"proxies on CPU {proxy_cpu}, hey/curl/nginx/SSE server/this script on CPU {load_cpu} "
        f"(the --workers comparison: proxies and hey on CPUs {every_cpu})"
    )
    print(
        f"\nsurrogate bench: {args.rounds} interleaved rounds, medians; hey {args.seconds:g} s per run "
        f"(keep-alive, one connection per worker, TLS not verified by hey); {pinning}; "
        f"load average {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"took {time.monotonic() - t_start:.0f} s"
        + (" — QUICK SMOKE RUN, not numbers to quote" if args.quick else "")
        + "\n"
    )
    print(render(results, args.downloads))
    print(
        "\nRatios are of the medians. hey opens its c connections at the start of each run, so c=64 "
        "includes 64 CONNECTs and 128 TLS handshakes. Direct latencies are at hey's 0.1 ms resolution. "
        "CPU is the proxy process's utime+stime ÷ responses. SSE spread: RMS of inter-arrival gaps "
        "minus 100 ms; the source's own jitter (asyncio timers, shared core) is in every column."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
