"""Downloads through the proxies (issue 19): 50 MB × N over HTTP/1.1 and HTTP/2 toward the
client, binary, text and JSON, bare mitmdump vs surrogate (vs main's surrogate, A/B), interleaved.

Every proxy runs pinned to one core (as bench/run.py), curl and nginx to the other. Bare mitmdump
is configured as bench/proxies.py does: ``stream_large_bodies=1`` (every body streamed, as
surrogate streams every body), lazy upstream connections, flow output off, every default addon;
it does not scrub. The upstream is nginx over HTTP/1.1 (no ``http2`` in its listener), so the
client-side protocol is the only difference between the HTTP/1.1 and HTTP/2 rows. mitmdump gets
only the binary body: without a scrubber the content type changes nothing it does; its row is
the reference for both of surrogate's.

Each round runs every (protocol, body, proxy) cell once, in an order rotated per round; the
figures are medians over the rounds, and each ratio is the median of the per-round ratios
(side by side in one round, so a busy moment of the shared machine hits both).

Run: ``nice python bench/download.py [--rounds 3] [--downloads 5] [--main DIR]``; ``--main`` is
a checkout of main (``git archive main | tar -x -C DIR``) whose surrogate is measured too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import harness  # noqa: E402
from load import Target, cpu_seconds, download  # noqa: E402
from proxies import Mitmdump, Surrogate, write_rules  # noqa: E402
from upstreams import BIG_BYTES, BenchCA, Nginx  # noqa: E402

TARGET = 0.9  # issue 19: surrogate with scrubbing on ≥ 0.9 × bare mitmdump's MB/s
PROTOCOLS = {"HTTP/1.1": "--http1.1", "HTTP/2": "--http2"}
# text: the binary file's every-byte-value bytes as text/plain (a % and a \ every 256 bytes, the
# escape finder's worst case); json: an API's JSON (bench/upstreams.py JSON_RECORD)
BODIES = {"binary": "/files/big", "text": "/text/big", "json": "/json/big"}


def _cores() -> tuple[int | None, int | None]:
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def _surrogate(name: str, root: Path, tmp: Path, rules: Path, ca: Path, cpu: int | None) -> Surrogate:
    """A surrogate whose code is the checkout at ``root`` (harness runs ``-m proxy`` there)."""
    saved = harness.ROOT
    harness.ROOT = root
    try:
        return Surrogate(name, tmp / name, rules, ca, cpu).start()
    finally:
        harness.ROOT = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--downloads", type=int, default=5, help="50 MB downloads per cell (one curl)")
    ap.add_argument("--main", type=Path, help="a checkout of main: its surrogate measured as well")
    ap.add_argument("--protocols", default="HTTP/1.1,HTTP/2")
    args = ap.parse_args()
    protocols = args.protocols.split(",")
    proxy_cpu, load_cpu = _cores()
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="surrogate-dl-") as d:
        tmp = Path(d)
        ca = BenchCA(tmp)
        nginx = Nginx(tmp, ca, load_cpu).start()
        stack.callback(nginx.stop)
        rules = write_rules(tmp, [nginx.port])
        mitm = Mitmdump(tmp, ca.ca_pem, proxy_cpu).start()
        stack.callback(mitm.stop)
        proxies: dict[str, Target] = {"mitmdump": mitm.target()}
        ours = _surrogate("surrogate", ROOT, tmp, rules, ca.ca_pem, proxy_cpu)
        stack.callback(ours.stop)
        proxies["surrogate"] = ours.target()
        if args.main:
            theirs = _surrogate("main", args.main.resolve(), tmp, rules, ca.ca_pem, proxy_cpu)
            stack.callback(theirs.stop)
            proxies["main"] = theirs.target()
        cells = [
            (proto, body, name)
            for proto in protocols
            for body in BODIES
            for name in proxies
            if not (name == "mitmdump" and body != "binary")
        ]

        busy: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
        per_cpu: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
        rss: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}

        def run(cell: tuple[str, str, str], times: int) -> float:
            proto, body, name = cell
            t = proxies[name]
            assert t.pid is not None
            url = f"https://{t.host}:{nginx.port}{BODIES[body]}"
            cpu, wall = cpu_seconds(t.pid), time.perf_counter()
            done = download(t, url, times, BIG_BYTES, load_cpu, [PROTOCOLS[proto]])
            got, used = done.mb_per_s, cpu_seconds(t.pid) - cpu
            rss[cell].append(done.rss_growth_mb or 0.0)
            busy[cell].append(used / (time.perf_counter() - wall))
            per_cpu[cell].append(times * BIG_BYTES / 1e6 / max(used, 0.01))
            return got

        for cell in cells:  # warm-up: leaf certificates, imports, first connections
            run(cell, 1)
        got: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
        for rnd in range(args.rounds):
            by = rnd % len(cells)
            for cell in cells[by:] + cells[:by]:
                got[cell].append(run(cell, args.downloads))
                print(f"round {rnd + 1} {cell}: {got[cell][-1]:.1f} MB/s", file=sys.stderr)
    _print(got, proxies, protocols, args)
    print("\nthe same, as MB per second of the proxy's CPU (less sensitive to a busy machine)")
    _print(per_cpu, proxies, protocols, args)
    print("the proxy's CPU while it downloads (CPU seconds / wall seconds, median): below 1.0 it waits")
    for cell, shares in busy.items():
        print(f"  {' '.join(cell):30} {statistics.median(shares):.2f}")
    print("the proxy's peak RSS growth during a cell (max over rounds; target ≤ 10 MB)")
    for cell, grew in rss.items():
        print(f"  {' '.join(cell):30} {max(grew):.1f} MB")
    return 0


def _print(got: dict[tuple[str, str, str], list[float]], proxies: dict[str, Target], protocols: list[str],
           args: argparse.Namespace) -> None:  # fmt: skip
    print(f"{args.downloads} × 50 MB per cell, {args.rounds} rounds, medians (MB/s); ratio = median of "
          f"per-round ratios to bare mitmdump's binary row of the same protocol")  # fmt: skip
    for proto in protocols:
        ref = got[(proto, "binary", "mitmdump")]
        print(f"{proto:9} mitmdump (no scrubbing)  {statistics.median(ref):7.1f}")
        for name in proxies:
            if name == "mitmdump":
                continue
            for body in BODIES:
                runs = got[(proto, body, name)]
                ratio = statistics.median(a / b for a, b in zip(runs, ref, strict=True))
                mark = "ok" if ratio >= TARGET else "BELOW"
                print(f"{proto:9} {name:9} {body:6}         {statistics.median(runs):7.1f}  "
                      f"{ratio:.2f}× (target ≥ {TARGET}×: {mark})")  # fmt: skip
    if "main" in proxies:
        for proto in protocols:
            for body in BODIES:
                a, b = got[(proto, body, "surrogate")], got[(proto, body, "main")]
                ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
                print(f"A/B {proto:9} {body:6} this branch / main: {ratio:.2f}×")


if __name__ == "__main__":
    raise SystemExit(main())
