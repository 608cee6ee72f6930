"""``surrogate run --workers 2``: a real supervisor and two real workers sharing one port.

Requests on many new connections are all served, by both workers; a control-API change made
through worker 0 is used by the next request whichever worker takes it; a reload reaches every
worker; the audit file is one stream of whole JSON lines; SIGTERM stops everything; a worker that
dies takes the proxy down with a clear message; a busy port is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import ROOT, ProxyProcess
from world import Stage, claim, control, egress, rules, wait_control

pytestmark = pytest.mark.e2e

WORKERS = 2
NEW_CONNECTIONS = 40  # P(all on one worker) = 2 * 2**-40 with the kernel's SO_REUSEPORT hash


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def listeners(port: int) -> int:
    """Listening TCP sockets on ``port`` (IPv4), from /proc/net/tcp."""
    needle = f":{port:04X} 00000000:0000 0A"
    return sum(needle in line for line in Path("/proc/net/tcp").read_text().splitlines())


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class World:
    def __init__(self, st: Stage) -> None:
        self.tmp = st.tmp
        self.upstream = st.upstream(["api.test", "other.test"])
        st.token("workers-token")
        self.rules = st.write("")
        self.write_rules(["api.test"])
        self.proxy = st.proxy(self.rules, ["api.test", "other.test"], workers=WORKERS, start=False)

    def write_rules(self, hosts: list[str]) -> None:
        self.rules.write_text(rules([egress(h, self.upstream.port) for h in hosts], claims=[claim("c")]))

    def api(self) -> httpx.Client:
        return control(self.proxy)

    def get(self, path: str, claim: str = "c", token: str = "workers-token", **headers: str) -> int:
        """One request on a new connection (a new CONNECT: the kernel picks a worker)."""
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        with httpx.Client(proxy=self.proxy.url(claim, token), verify=ctx, timeout=20) as client:
            host = headers.pop("host", "api.test")
            return client.get(f"https://{host}:{self.upstream.port}{path}", headers=headers).status_code

    def events(self, prefix: str, count: int = 1) -> list[dict[str, object]]:
        """The audit events of paths under ``prefix``, once ``count`` are there (or after 5 s):
        the supervisor relays a worker's lines in batches, up to 5 ms after the flow ended."""
        deadline = time.monotonic() + 5
        while True:
            found = [e for e in self.proxy.audit_events() if str(e.get("path") or "").startswith(prefix)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("workers")) as st:
        w = World(st)
        w.proxy.start()
        deadline = time.monotonic() + 20
        assert w.proxy.proc is not None
        while (len(children(w.proxy.proc.pid)) < WORKERS or listeners(w.proxy.port) < WORKERS) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        wait_control(w.proxy, deadline - time.monotonic())
        yield w


def test_the_workers_share_one_port_and_both_serve(world: World) -> None:
    assert world.proxy.proc is not None
    workers = children(world.proxy.proc.pid)
    assert len(workers) == WORKERS
    assert listeners(world.proxy.port) == WORKERS  # one SO_REUSEPORT socket per worker
    codes = [world.get(f"/spread/{i}") for i in range(NEW_CONNECTIONS)]
    assert codes == [200] * NEW_CONNECTIONS
    time.sleep(0.3)  # audit events are written when each flow ends, and relayed
    events = world.events("/spread/", NEW_CONNECTIONS)
    assert len(events) == NEW_CONNECTIONS
    assert {e["worker"] for e in events} == set(workers)


def test_metrics_count_every_workers_requests(world: World) -> None:
    """/metrics is served by worker 0 but sums every worker's counters (multiprocess mode)."""
    with world.api() as api:
        text = api.get("/metrics").text
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("surrogate_requests_total{")
    )
    audited = [e for e in world.proxy.audit_events() if e["event"] in ("request", "tunnel")]
    assert counted == len(audited) >= NEW_CONNECTIONS
    assert len({e["worker"] for e in audited}) == WORKERS


def test_audit_file_is_one_stream_of_whole_lines_numbered_per_worker(world: World) -> None:
    lines = world.proxy.audit_path.read_text().splitlines()
    events = [json.loads(line) for line in lines]  # a torn or interleaved line would not parse
    by_worker: dict[int, list[int]] = {}
    for e in events:
        by_worker.setdefault(e["worker"], []).append(e["seq"])
    for seqs in by_worker.values():
        assert seqs == list(range(1, len(seqs) + 1))  # each worker's own order, nothing lost


def test_a_control_api_change_reaches_every_worker_by_the_next_request(world: World) -> None:
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "live", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/live/credentials/k", json={"hosts": ["api.test"], "value": "first-value"})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
        assert world.get("/ctl/before", "live", token, **{"X-Api-Key": placeholder}) == 200
        r = api.patch("/v1/claims/live/credentials/k", json={"value": "second-value"})
        assert r.status_code == 200, r.text
    codes = [
        world.get(f"/ctl/after/{i}", "live", token, **{"X-Api-Key": placeholder})
        for i in range(NEW_CONNECTIONS)
    ]
    assert codes == [200] * NEW_CONNECTIONS
    sent = [
        v
        for r in world.upstream.requests
        if r.path.startswith("/ctl/after/")
        for k, v in r.headers
        if k.lower() == "x-api-key"
    ]
    assert sent == ["second-value"] * NEW_CONNECTIONS
    assert world.proxy.proc is not None
    after = world.events("/ctl/after/", NEW_CONNECTIONS)
    assert {e["worker"] for e in after} == set(children(world.proxy.proc.pid))


def test_a_reload_reaches_every_worker(world: World) -> None:
    with pytest.raises(httpx.ProxyError, match="403"):  # the CONNECT is refused
        world.get("/reload/before", host="other.test")
    world.write_rules(["api.test", "other.test"])
    assert world.proxy.proc is not None
    os.kill(world.proxy.proc.pid, signal.SIGHUP)  # passed on to every worker
    workers = set(children(world.proxy.proc.pid))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        applied = {
            e["worker"]
            for e in world.proxy.audit_events()
            if e["event"] == "reload" and e["outcome"] == "applied"
        }
        if applied == workers:
            break
        time.sleep(0.1)
    assert applied == workers
    codes = [world.get(f"/reload/after/{i}", host="other.test") for i in range(NEW_CONNECTIONS)]
    assert codes == [200] * NEW_CONNECTIONS


def test_the_workers_never_connect_to_their_own_port(world: World) -> None:
    """Every worker knows the shared port as its own, even under a rule that allows everything."""
    world.rules.write_text(rules([egress("*", ports=[], scheme="http")], claims=[claim("c")]))
    assert world.proxy.proc is not None
    os.kill(world.proxy.proc.pid, signal.SIGHUP)
    time.sleep(1.5)
    proxy = world.proxy.url("c", "workers-token")
    for i in range(16):  # new connections: both workers get some
        with httpx.Client(proxy=proxy, timeout=20) as client:
            assert client.get(f"http://127.0.0.1:{world.proxy.port}/self/{i}").status_code == 403
    events = world.events("/self/", 16)
    assert {e["reason"] for e in events} == {"own_listener"} and len(events) == 16


def test_a_busy_port_is_refused_before_any_worker_starts(world: World, tmp_path: Path) -> None:
    with Stage(tmp_path) as st:  # its arguments only: it is run here, on the busy port
        other = st.proxy(world.rules, upstream_ca=None, workers=WORKERS, start=False)
        other.args[other.args.index("--listen") + 1] = f"127.0.0.1:{world.proxy.port}"
        done = subprocess.run(other.args, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert f"127.0.0.1:{world.proxy.port} is already in use" in done.stderr
    assert "Traceback" not in done.stderr


@contextlib.contextmanager
def _small(tmp: Path) -> Iterator[ProxyProcess]:
    """A started two-worker proxy with one rule and no upstream."""
    with Stage(tmp) as st:
        st.token("t")
        proxy = st.proxy(rules([egress("api.test")], claims=[claim("c")]), upstream_ca=None, workers=WORKERS)
        assert proxy.proc is not None
        deadline = time.monotonic() + 20
        while len(children(proxy.proc.pid)) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proxy


def test_sigterm_to_the_supervisor_stops_every_worker(tmp_path: Path) -> None:
    with _small(tmp_path) as proxy:
        assert proxy.proc is not None
        workers = children(proxy.proc.pid)
        assert len(workers) == WORKERS
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(timeout=20) == 0
        assert not any(alive(pid) for pid in workers)
        assert listeners(proxy.port) == 0


def test_a_dead_worker_is_reported_and_stops_the_proxy(tmp_path: Path) -> None:
    with _small(tmp_path) as proxy:
        assert proxy.proc is not None
        first, second = children(proxy.proc.pid)
        os.kill(second, signal.SIGKILL)
        assert proxy.proc.wait(timeout=20) == 1
    assert f"worker 1 (pid {second}) exited with status -9; stopping the other workers" in proxy.stderr()
    assert not alive(first)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_worker_count_is_a_usage_error(tmp_path: Path, value: str) -> None:
    (tmp_path / "rules.yaml").write_text(rules(pools={}, claims=[]))
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "run", "--rules", str(tmp_path / "rules.yaml"), "--workers", value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert f"--workers: {value!r} is not a positive whole number" in done.stderr
