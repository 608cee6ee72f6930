"""The fleet benchmark (issue 14): two ``surrogate run`` nodes and one ``surrogate control`` on a
private PostgreSQL cluster (tests/pg.py's, started here in a temporary directory and stopped by
its PID). A script, not a timed test::

    .venv/bin/python bench/fleet.py [--quick] [--only latency|rps|write] [--per-claim N]

It prints:

1. **write → first use on the other node**: a PATCH through the control API, then requests
   through a node on an open tunnel until the upstream sees the new value; p50/p99 ms from the
   write's acknowledgement to the answer of the first request that carried it. Node A reads the
   store ``sync=strict`` (the version on each request), node B ``sync=notify`` (LISTEN/NOTIFY
   and a 1 s poll).
2. **requests/s**: hey (small HTTPS requests, keep-alive) through node A alone, then through
   both nodes at once, on this machine (the two nodes share its cores with the load generator
   and the upstream, so the ratio says what one machine gives, not what two hosts would).
3. **the cost of a write with 10,000 credentials stored**: CPU ms of each node per write (its
   process's utime + stime over the writes, minus the same idle time before), and the ms of
   one ``changes_since`` read of that write (what each node re-reads). The credentials are
   spread over claims (``--per-claim``, default 10); the write changes one of them. The requests
   go through another claim, or with ``--via-written`` through the written one (whose responses
   are scrubbed with its values: the scrubber's patterns follow each write).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import httpx  # noqa: E402
import pg  # noqa: E402
from load import Target, cpu_seconds, hey  # noqa: E402
from world import Stage, egress, rules  # noqa: E402

from proxy.store.keyring import KeyRing  # noqa: E402
from proxy.store.postgres import PostgresStore  # noqa: E402


def start_cluster(stack: ExitStack) -> pg.Cluster:
    bindir = pg.binaries()
    if bindir is None:
        sys.exit("PostgreSQL server binaries not installed: apt-get install postgresql")
    as_root = os.geteuid() == 0
    root = pg._make_root(as_root)
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    pw_dir = Path(tempfile.mkdtemp(prefix="surrogate-bench-pw-"))
    stack.callback(shutil.rmtree, pw_dir, ignore_errors=True)
    password = secrets.token_hex(16)
    pwfile = pw_dir / "password"
    pwfile.write_text(password)
    server_pw = root / "initdb-password"
    server_pw.write_text(password)
    if as_root:
        shutil.chown(server_pw, pg.USER, pg.USER)
    cluster = pg.Cluster(bindir, root, pg._free_port(), pwfile, as_root)
    auth = ("--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={server_pw}")
    cluster._run(
        str(bindir / "initdb"), "-D", str(cluster.data), "-U", pg.USER, *auth, "-E", "UTF8", "--locale=C"
    )
    server_pw.unlink()
    cluster.start()
    stack.callback(cluster.stop)
    return cluster


PARTS = ("latency", "rps", "write")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter load, 2,000 credentials")
    ap.add_argument("--per-claim", type=int, default=10, help="credentials per claim of the stored ones")
    ap.add_argument("--via-written", action="store_true",
                    help="part 3: requests through the written claim (scrubbed with its values)")  # fmt: skip
    ap.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    args = ap.parse_args()
    parts = set(args.only or PARTS)
    per_claim = max(1, args.per_claim)
    rounds, seconds, stored, writes = (20, 5, 2000, 10) if args.quick else (100, 10, 10_000, 30)
    with ExitStack() as stack:
        cluster = start_cluster(stack)
        url = cluster.database()
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="surrogate-fleet-bench-")))
        st = stack.enter_context(Stage(tmp))
        st.every_canary = True
        upstream = st.upstream(["api.test"])
        rules_path = st.write(rules([egress("api.test", upstream.port)], claims=[]))
        key = tmp / "shared.key"
        sock = tmp / "control" / "api.sock"
        ctl = [sys.executable, "-m", "proxy", "control", "--rules", str(rules_path), "--state-dir",
               str(tmp / "control"), "--control-socket", str(sock), "--audit-file", str(tmp / "ctl.jsonl"),
               "--store", url, "--key-file", str(key)]  # fmt: skip
        control = subprocess.Popen(ctl, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(lambda: (control.terminate(), control.wait(10)))
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        nodes = []
        for name, store_url in (("a", url), ("b", url + "&sync=notify&poll=1")):
            (tmp / name).mkdir()
            node_args = ["--store", store_url, "--key-file", str(key), "--control-socket", "none"]
            nodes.append(st.proxy(rules_path, ["api.test"], workdir=tmp / name, start=False, workers=1,
                                  args=node_args))  # fmt: skip
        for n in nodes:
            n.start(timeout=30)
        api = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://control", timeout=30
        )
        token = api.post("/v1/claims", json={"id": "bench", "pool": "p"}).json()["proxy_token"]
        put = api.put("/v1/claims/bench/credentials/gh", json={"hosts": ["api.test"], "value": "v0"})
        placeholder = put.json()["placeholder"]
        target = f"https://api.test:{upstream.port}"

        print(f"fleet benchmark ({'quick' if args.quick else 'full'}), {os.cpu_count()} cores, PostgreSQL "
              f"{bindir_version(cluster)}")  # fmt: skip
        # 1. write -> first use on the other node
        for label, node in (("strict", nodes[0]), ("sync=notify", nodes[1])) if "latency" in parts else ():
            ctx = ssl.create_default_context(cafile=node.ca_pem)
            with httpx.Client(proxy=node.url("bench", token), verify=ctx, timeout=30) as client:
                client.get(target + "/warm")
                lat: list[float] = []
                for i in range(rounds):
                    value = f"v{label}{i}{secrets.token_hex(4)}"
                    api.patch("/v1/claims/bench/credentials/gh", json={"value": value}).raise_for_status()
                    acked = time.perf_counter()
                    while True:
                        client.get(target + "/w", headers={"Authorization": f"Bearer {placeholder}"})
                        last = upstream.requests[-1]
                        if (
                            dict((k.lower(), v) for k, v in last.headers).get("authorization")
                            == f"Bearer {value}"
                        ):
                            break
                    lat.append((time.perf_counter() - acked) * 1000)
            print(f"write -> first use on the other node, {label:11}: p50 {pct(lat, 50):7.1f} ms  "
                  f"p99 {pct(lat, 99):7.1f} ms  ({rounds} writes)")  # fmt: skip
        # 2. requests/s, one node vs two
        hdr = [f"Authorization: Bearer {placeholder}"]
        tgt = [
            Target(f"node-{c}", "api.test", n.ca_pem, n.url("bench", token), n.proc.pid if n.proc else None)
            for c, n in zip("ab", nodes, strict=True)
        ]
        if "rps" in parts:
            requests_per_second(tgt, target + "/load", seconds, hdr)
        if "write" not in parts:
            api.close()
            return
        # 3. cost of a write with many credentials stored
        store = PostgresStore.open(url, KeyRing.load_or_create(key))
        t0 = time.perf_counter()
        via = ("bench", token)
        for i in range(stored):
            owner = f"bulk{i // per_claim:05d}"
            if i % per_claim == 0:
                made = store.create_claim(owner, "p")[1]
                via = (owner, made) if args.via_written and i == 0 else via
            store.put_credential(owner, f"c{i:05d}", value=f"x{i}".encode(), hosts=["api.test"])
        print(f"stored {stored} credentials ({per_claim} per claim) in {time.perf_counter() - t0:.1f} s")
        time.sleep(3)  # every node has read them
        pids = [n.proc.pid for n in nodes if n.proc]
        clients = [
            stack.enter_context(httpx.Client(proxy=n.url(*via), timeout=30,
                                             verify=ssl.create_default_context(cafile=n.ca_pem)))
            for n in nodes
        ]  # fmt: skip
        for c in clients:
            c.get(target + "/n")  # open tunnels: what follows costs requests, not handshakes

        def loop(write: bool) -> tuple[list[float], list[float]]:
            """CPU s of each node over ``writes`` rounds of (a write,) a request on each node."""
            reads: list[float] = []
            before = [cpu_seconds(p) for p in pids]
            for i in range(writes):
                if write:
                    api.patch(
                        "/v1/claims/bulk00000/credentials/c00001", json={"value": f"w{i}"}
                    ).raise_for_status()
                    v = store.data_version()
                    r0 = time.perf_counter()
                    store.changes_since(v - 1)
                    reads.append((time.perf_counter() - r0) * 1000)
                for c in clients:  # the node notices the write (if any) and re-reads
                    c.get(target + "/n")
            return [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)], reads

        base, _ = loop(False)
        with_writes, reads = loop(True)
        per = [(w - b) / writes * 1000 for w, b in zip(with_writes, base, strict=True)]
        print(f"a write with {stored} credentials stored: node CPU per write (beyond the request) "
              f"A {per[0]:.1f} ms, B {per[1]:.1f} ms; changes_since read "
              f"p50 {statistics.median(reads):.2f} ms p99 {pct(reads, 99):.2f} ms "
              f"({writes} writes, requests through claim {via[0]})")  # fmt: skip
        store.close()
        api.close()


def requests_per_second(tgt: list[Target], url: str, seconds: int, hdr: list[str]) -> None:
    one = hey(tgt[0], url, 8, seconds, hdr, None)
    both: list[float] = [0.0, 0.0]

    def run(i: int) -> None:
        both[i] = hey(tgt[i], url, 8, seconds, hdr, None).rps

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"requests/s: one node {one.rps:7.0f} (p50 {one.p50_ms:.1f} ms)   two nodes {sum(both):7.0f} "
          f"({both[0]:.0f} + {both[1]:.0f})   ratio {sum(both) / one.rps:.2f}")  # fmt: skip


def bindir_version(cluster: pg.Cluster) -> str:
    out = subprocess.run([str(cluster.bin / "postgres"), "--version"], capture_output=True, text=True)
    return out.stdout.strip().split()[-1].rstrip(")") if out.returncode == 0 else "?"


if __name__ == "__main__":
    main()
