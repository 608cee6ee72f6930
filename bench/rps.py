"""Requests/s and proxy CPU per request (issue 19, first target), side by side.

hey at c=16 and c=1 with one credential swapped per request (section 1 of bench/run.py, alone),
against bare mitmdump, this worktree's surrogate and, with ``--main DIR``, a second surrogate run
from another checkout's code (``python -P`` with ``PYTHONPATH=DIR``), so a cut's gain reads as a
side-by-side ratio. Proxies pinned to one core, hey and nginx to the other; interleaved rounds
(order rotated), medians. Prints each target's figure: CPU µs/request ≤ 0.5× mitmdump's and
req/s ≥ 2.0× at c=16.

Run: ``nice .venv/bin/python bench/rps.py [--main /work/main] [--rounds 3] [--seconds 4]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from load import HeyResult, Target, hey  # noqa: E402
from proxies import PLACEHOLDER, UPSTREAM_HOST, Mitmdump, Surrogate, write_rules  # noqa: E402
from upstreams import BenchCA, Nginx  # noqa: E402

CONCURRENCY = (16, 1)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--main", type=Path, help="also run a surrogate from this checkout's code")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument(
        "--together",
        action="store_true",
        help="with --main: only load both surrogates at once, on the one proxy core (see _together)",
    )
    return ap.parse_args()


def _from_checkout(s: Surrogate, checkout: Path) -> Surrogate:
    """Have ``s`` import ``proxy``/``addons`` from ``checkout`` instead of this worktree."""
    args = s.process.args
    i = args.index(sys.executable)
    args.insert(i + 1, "-P")  # no cwd on sys.path: PYTHONPATH decides
    s.process.env["PYTHONPATH"] = str(checkout.resolve())
    return s


def _row(name: str, runs: list[HeyResult], base: tuple[float, float] | None) -> tuple[float, float]:
    rps = statistics.median(r.rps for r in runs)
    cpu = statistics.median(r.cpu_us_per_req or 0.0 for r in runs)
    ratio = f"  {rps / base[0]:5.2f}× req/s  {cpu / base[1]:5.2f}× CPU" if base else ""
    others = sum(r.others for r in runs)
    print(
        f"  {name:<16} {rps:9.0f} req/s  {cpu:8.1f} µs/req{ratio}"
        + (f"  ({others} non-200)" if others else "")
    )
    return rps, cpu


def _together(
    ours: Target, main: Target, url: str, bearer: list[str], load_cpu: int | None, args: argparse.Namespace
) -> int:
    """The A/B for a busy machine: both surrogates loaded at once by two hey at c=16, sharing the
    proxy core, so whatever else runs slows both alike; the scheduler gives each about half the
    core, and the one that needs less CPU per request answers more of them."""
    ratios: list[tuple[float, float]] = []
    with ThreadPoolExecutor(2) as pool:
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}…", file=sys.stderr)
            a, b = pool.map(lambda t: hey(t, url, 16, args.seconds, bearer, load_cpu), (ours, main))
            ratios.append((a.rps / b.rps, (a.cpu_us_per_req or 0) / (b.cpu_us_per_req or 1)))
            print(
                f"  {a.rps:.0f} vs {b.rps:.0f} req/s, {a.cpu_us_per_req:.0f} vs {b.cpu_us_per_req:.0f} µs/req"
            )
    rps = statistics.median(r for r, _ in ratios)
    cpu = statistics.median(c for _, c in ratios)
    print(f"together, {args.rounds} rounds × {args.seconds:g} s at c=16, medians of the per-round ratios:")
    print(f"this worktree vs main: {rps:.3f}× req/s, {cpu:.3f}× CPU/request")
    return 0


def main() -> int:
    args = _args()
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, load_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="surrogate-rps-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        ca = BenchCA(tmp)
        nginx = Nginx(tmp, ca, load_cpu).start()
        stack.callback(nginx.stop)
        rules = write_rules(tmp, [nginx.port])
        mitm = Mitmdump(tmp, ca.ca_pem, proxy_cpu).start()
        stack.callback(mitm.stop)
        proxies = [Surrogate("surrogate", tmp / "wt", rules, ca.ca_pem, proxy_cpu)]
        if args.main:
            proxies.append(
                _from_checkout(Surrogate("main", tmp / "main", rules, ca.ca_pem, proxy_cpu), args.main)
            )
        targets: list[Target] = [mitm.target()]
        for p in proxies:
            p.start()
            stack.callback(p.stop)
            targets.append(p.target())
        small = f"https://127.0.0.1:{nginx.port}/small"  # mitmdump cannot be told where api.test is
        urls = {
            t.name: small if t.name == "mitmdump" else small.replace("127.0.0.1", UPSTREAM_HOST)
            for t in targets
        }
        bearer = [f"Authorization: Bearer {PLACEHOLDER}"]
        for t in targets:  # leaf certificates, imports, first connections
            hey(t, urls[t.name], 16, 1, bearer, load_cpu)
        if args.main and args.together:
            return _together(targets[1], targets[2], urls["main"], bearer, load_cpu, args)
        runs: dict[tuple[str, int], list[HeyResult]] = {}
        for rnd in range(args.rounds):
            print(f"round {rnd + 1}/{args.rounds}…", file=sys.stderr)
            order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
            for c in CONCURRENCY:
                for t in order:
                    runs.setdefault((t.name, c), []).append(
                        hey(t, urls[t.name], c, args.seconds, bearer, load_cpu)
                    )
    print(
        f"\n{args.rounds} interleaved rounds × {args.seconds:g} s, medians; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    figures: dict[tuple[str, int], tuple[float, float]] = {}
    for c in CONCURRENCY:
        print(f"c={c} (ratios against mitmdump)")
        base = _row("mitmdump", runs[("mitmdump", c)], None)
        for t in targets[1:]:
            rps, cpu = _row(t.name, runs[(t.name, c)], base)
            figures[(t.name, c)] = (rps / base[0], cpu / base[1])
    rps16, cpu16 = figures[("surrogate", 16)]
    met = {True: "MET", False: "not met"}
    print(f"target: CPU/request at c=16 ≤ 0.50× mitmdump: {cpu16:.2f}× {met[cpu16 <= 0.5]}")
    print(f"target: req/s at c=16 ≥ 2.00× mitmdump: {rps16:.2f}× {met[rps16 >= 2.0]}")
    if args.main:
        for c in CONCURRENCY:
            (wr, wc), (mr, mc) = figures[("surrogate", c)], figures[("main", c)]
            print(f"this worktree vs main at c={c}: {wr / mr:.3f}× req/s, {wc / mc:.3f}× CPU/request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
