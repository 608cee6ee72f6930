"""``surrogate run --workers 2`` against ``--workers 1`` (issue 19): the ratio, and what bounds it.

Two surrogates (``--workers 1`` and ``--workers 2``) and nginx (the 100-byte response) share every
core with hey, unpinned, as in bench/run.py section 6. Each run is hey for ``--seconds`` at
c=64 and c=16; the order is ABBA within a round and BAAB in the next, so drift cancels; medians.

Per run it records, besides hey's req/s:

- the **per-worker split**: the requests each worker served (the ``worker`` pid of the audit
  lines written during the run) and the connections each one holds at the end of the run
  mid-run (its fds' sockets in /proc/PID/net/tcp: hey keeps its c connections open for the
  whole run, so this is the kernel's SO_REUSEPORT spread);
- **CPU** (utime+stime from /proc) of each worker, of the supervisor, of nginx, and of hey
  (``RUSAGE_CHILDREN`` over its run), in cores (CPU seconds ÷ wall seconds) and µs per request;
- the **bound** these imply: with hey, nginx and the supervisor taking X cores of the machine's
  N, the workers can use at most N − X. Scaled by the cost of a request measured in each mode,
  the req/s the 2 workers could reach if they had all of N − X is
  ``(N − X₂) / worker_cpu_per_req₂``; divided by the 1-worker req/s it gives the ratio's bound
  (a 1-worker proxy can use at most one core, whatever is free). A second bound is printed
  with the whole machine's cost per request: ``N / (hey+nginx+supervisor+workers per req)₂``.

Run (about 2 minutes; nice it on a shared machine):
``nice .venv/bin/python bench/workers.py [--rounds 2] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from load import CLK_TCK, cpu_seconds  # noqa: E402
from proxies import PLACEHOLDER, UPSTREAM_HOST, Surrogate, write_rules  # noqa: E402
from upstreams import BenchCA, Nginx  # noqa: E402

WORKERS = (1, 2)


def machine_busy() -> float:
    """CPU seconds every process of the machine has used so far (/proc/stat's first line: all
    but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's /proc children list)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(found))


def client_connections(pid: int, port: int) -> int:
    """Established TCP connections ``pid`` holds whose local port is ``port`` (the proxy's: a
    client's connection, not an upstream one), from its fds' socket inodes and /proc/net/tcp."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    n = 0
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            n += state == "01" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes
    return n


@dataclass
class Run:
    rps: float
    requests: int
    seconds: float
    worker_cpu: dict[int, float]  # worker pid -> CPU seconds in the run
    worker_requests: dict[int, int]  # worker pid -> audit lines written in the run
    worker_connections: dict[int, int]  # worker pid -> client connections it held mid-run
    supervisor_cpu: float
    nginx_cpu: float
    hey_cpu: float
    machine_cpu: float  # every process of the machine, ours and others'

    def cores(self, cpu: float) -> float:
        return cpu / self.seconds

    def per_req_us(self, cpu: float) -> float:
        return cpu / max(self.requests, 1) * 1e6


@dataclass
class Proxy:
    n: int
    surrogate: Surrogate
    runs: dict[int, list[Run]] = field(default_factory=dict)

    def workers(self) -> list[int]:
        pid = self.surrogate.pid
        return children(pid) if self.n > 1 else [pid]


def _nginx_pids(nginx: Nginx) -> list[int]:
    assert nginx.proc is not None
    return [nginx.proc.pid, *children(nginx.proc.pid)]


def _audit_counts(path: Path, offset: int, fallback: int) -> tuple[dict[int, int], int]:
    counts: dict[int, int] = {}
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "request":
            pid = int(event.get("worker") or fallback)
            counts[pid] = counts.get(pid, 0) + 1
    return counts, offset + end


def one_run(p: Proxy, nginx: Nginx, url: str, c: int, seconds: float) -> Run:
    target = p.surrogate.target()
    assert target.proxy_url is not None
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(c), "-disable-compression", "-x", target.proxy_url]
    cmd += ["-H", f"Authorization: Bearer {PLACEHOLDER}", url]
    workers = p.workers()
    sup = p.surrogate.pid
    ng = _nginx_pids(nginx)
    audit = p.surrogate.process.audit_path
    offset = audit.stat().st_size if audit.exists() else 0
    w0 = {w: cpu_seconds(w) for w in workers}
    s0 = cpu_seconds(sup) if p.n > 1 else 0.0
    n0 = sum(cpu_seconds(x) for x in ng)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m0 = machine_busy()
    t0 = time.monotonic()
    hey = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    time.sleep(seconds / 2)  # hey holds its c connections for the whole run: the kernel's spread
    conns = {w: client_connections(w, p.surrogate.process.port) for w in workers}
    out, _ = hey.communicate()
    wall = time.monotonic() - t0
    m1 = machine_busy()
    if hey.returncode != 0:
        raise RuntimeError(f"hey exited {hey.returncode}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    time.sleep(0.3)  # the last audit lines
    w1 = {w: cpu_seconds(w) for w in workers}
    s1 = cpu_seconds(sup) if p.n > 1 else 0.0
    n1 = sum(cpu_seconds(x) for x in ng)
    counts, _ = _audit_counts(audit, offset, sup)
    rps = float(out.split("Requests/sec:")[1].split()[0])
    ok = sum(int(n) for code, n in _statuses(out) if code == "200")
    return Run(
        rps=rps,
        requests=ok,
        seconds=wall,
        worker_cpu={w: w1[w] - w0[w] for w in workers},
        worker_requests=counts,
        worker_connections=conns,
        supervisor_cpu=s1 - s0,
        nginx_cpu=n1 - n0,
        hey_cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
        machine_cpu=m1 - m0,
    )


def _statuses(out: str) -> list[tuple[str, str]]:
    part = out.partition("Status code distribution:")[2].partition("Error distribution:")[0]
    rows = []
    for line in part.splitlines():
        line = line.strip()
        if line.startswith("["):
            code, _, rest = line[1:].partition("]")
            rows.append((code, rest.split()[0]))
    return rows


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(proxies: dict[int, Proxy], concurrencies: tuple[int, ...], ncpu: int) -> None:
    one, two = proxies[1], proxies[2]
    for c in concurrencies:
        a, b = one.runs[c], two.runs[c]
        ra, rb = _med([r.rps for r in a]), _med([r.rps for r in b])
        print(
            f"\n== c={c}: --workers 1 {ra:.0f} req/s, --workers 2 {rb:.0f} req/s: ratio {rb / ra:.2f}× "
            f"(runs: 1w {[round(r.rps) for r in a]}, 2w {[round(r.rps) for r in b]})"
        )
        for name, runs in (("1w", a), ("2w", b)):
            wc = _med([sum(r.worker_cpu.values()) / r.seconds for r in runs])
            wus = _med([r.per_req_us(sum(r.worker_cpu.values())) for r in runs])
            hc = _med([r.cores(r.hey_cpu) for r in runs])
            hus = _med([r.per_req_us(r.hey_cpu) for r in runs])
            nc = _med([r.cores(r.nginx_cpu) for r in runs])
            nus = _med([r.per_req_us(r.nginx_cpu) for r in runs])
            sc = _med([r.cores(r.supervisor_cpu) for r in runs])
            sus = _med([r.per_req_us(r.supervisor_cpu) for r in runs])
            print(
                f"  {name}: workers {wc:.2f} cores ({wus:.0f} µs/req); "
                f"hey {hc:.2f} cores ({hus:.0f} µs/req); "
                f"nginx {nc:.2f} ({nus:.0f} µs/req); supervisor {sc:.2f} ({sus:.0f} µs/req); "
                f"sum {wc + hc + nc + sc:.2f} of {ncpu}"
            )
        for r in b:
            split = sorted(r.worker_requests.values(), reverse=True)
            total = max(sum(split), 1)
            per_cpu = [f"{r.cores(v):.2f}" for v in r.worker_cpu.values()]
            print(
                f"  2w run: requests per worker {split} ({[f'{s / total:.0%}' for s in split]}), "
                f"client connections per worker {list(r.worker_connections.values())}, "
                f"cores per worker {per_cpu}"
            )
        for name, runs in (("1w", a), ("2w", b)):
            ours = [r.hey_cpu + r.nginx_cpu + r.supervisor_cpu + sum(r.worker_cpu.values()) for r in runs]
            foreign = _med([max(r.machine_cpu - o, 0.0) / r.seconds for r, o in zip(runs, ours, strict=True)])
            print(
                f"  {name}: processes outside this bench took {foreign:.2f} of {ncpu} cores"
                + (" — a busy machine: not a quiet-machine ratio" if foreign > 0.2 else "")
            )
        # the bound: what the 2 workers could do with every core the others leave them
        others = _med([r.cores(r.hey_cpu + r.nginx_cpu + r.supervisor_cpu) for r in b])
        wus2 = _med([r.per_req_us(sum(r.worker_cpu.values())) for r in b])
        all_us2 = _med(
            [r.per_req_us(r.hey_cpu + r.nginx_cpu + r.supervisor_cpu + sum(r.worker_cpu.values())) for r in b]
        )
        bound_rps = (ncpu - others) / wus2 * 1e6
        machine_rps = ncpu / all_us2 * 1e6
        print(
            f"  bound: hey+nginx+supervisor take {others:.2f} cores at 2w: the workers can use at most "
            f"{ncpu - others:.2f} → {bound_rps:.0f} req/s at {wus2:.0f} µs/req = {bound_rps / ra:.2f}× 1w; "
            f"whole machine at {all_us2:.0f} µs/req (every process) → {machine_rps:.0f} req/s = "
            f"{machine_rps / ra:.2f}× 1w"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 16])
    args = ap.parse_args()
    if shutil.which("hey") is None:
        print("error: hey is not installed", file=sys.stderr)
        return 1
    ncpu = len(os.sched_getaffinity(0))
    load0 = os.getloadavg()[0]
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="surrogate-workers-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        ca = BenchCA(tmp)
        nginx = Nginx(tmp, ca, None).start()
        stack.callback(nginx.stop)
        rules = write_rules(tmp, [nginx.port])
        url = f"https://{UPSTREAM_HOST}:{nginx.port}/small"
        proxies: dict[int, Proxy] = {}
        for n in WORKERS:
            s = Surrogate(f"surrogate-{n}w", tmp / f"w{n}", rules, ca.ca_pem, None, workers=n)
            s.process.start(timeout=90)  # a busy shared machine starts Python slowly
            stack.callback(s.stop)
            proxies[n] = Proxy(n, s)
        time.sleep(1.0)  # the second worker's listener
        for p in proxies.values():  # warm up: leaf certificate, imports, first connections
            one_run(p, nginx, url, 64, 1)
        for rnd in range(args.rounds):
            order = (1, 2, 2, 1) if rnd % 2 == 0 else (2, 1, 1, 2)
            for c in args.concurrency:
                for n in order:
                    run = one_run(proxies[n], nginx, url, c, args.seconds)
                    proxies[n].runs.setdefault(c, []).append(run)
                    print(f"round {rnd + 1} c={c} --workers {n}: {run.rps:.0f} req/s", file=sys.stderr)
    print(
        f"\nworkers bench: {args.rounds} rounds (ABBA/BAAB), hey {args.seconds:g} s per run, {ncpu} CPUs "
        f"shared unpinned by hey, nginx and the proxies; load average {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; CLK_TCK {CLK_TCK}"
    )
    report(proxies, tuple(args.concurrency), ncpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
