"""A fleet on a real PostgreSQL (issue 14): two ``surrogate run`` nodes (one ``sync=strict``, one
``sync=notify``) and one ``surrogate control --store`` process.

- The database stopped (``pg_ctl``-style fast shutdown by PID, on a cluster of the test's own):
  both nodes keep serving their last-known-good copy (open tunnels and new CONNECTs) within the
  staleness bound (``stale=``), then refuse store claims ``503 store_stale`` and ``/readyz`` says
  ``stale``; a node started meanwhile starts, refuses ``store_never_synced`` and is not ready
  (``never_synced``); the database started again, every node resyncs and serves, the writes
  acknowledged before the outage are all there and a new write is used at once.
- Revocation on every node: a PATCH written through one node's control API is used by the next
  request of an open keep-alive tunnel on the other node; a credential delete, a claim delete
  and a token rotation close that claim's open tunnels on both nodes.

Every log, the ``pg_dump`` and the cluster's data directory (WAL included, tests/pg.py) are
scanned for the canaries afterwards.
"""

from __future__ import annotations

import base64
import http.client
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import canary
import httpx
import pytest
from harness import ROOT, ProxyProcess, free_port
from pg import Cluster
from pg import own_pg_cluster as own_pg_cluster  # a cluster this module's outage test may stop
from servers import Upstream
from test_control_process import listening, stop, wait_for
from world import Stage, egress, rules, wait_control

from proxy.store.keyring import KeyRing
from proxy.store.postgres import PostgresStore

pytestmark = pytest.mark.e2e

STALE = 6.0  # the bound the nodes run with (seconds)


class Tunnel:
    """One CONNECT tunnel through a node, kept open (http.client never reopens it behind our back)."""

    def __init__(self, proxy: ProxyProcess, upstream: Upstream, claim: str, token: str) -> None:
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        auth = base64.b64encode(f"{claim}:{token}".encode()).decode()
        self.conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=ctx, timeout=10)
        self.conn.set_tunnel("api.test", upstream.port, headers={"Proxy-Authorization": f"Basic {auth}"})
        self.conn.connect()
        self.conn.auto_open = 0  # a closed tunnel is an error, never silently a new one

    def get(self, path: str, placeholder: str) -> tuple[int, str]:
        self.conn.request("GET", path, headers={"Authorization": f"Bearer {placeholder}"})
        r = self.conn.getresponse()
        return r.status, r.read().decode(errors="replace")

    def closed_within(self, seconds: float) -> bool:
        """True when the proxy closes the tunnel within ``seconds`` (nothing is sent meanwhile)."""
        sock = self.conn.sock
        assert sock is not None
        sock.settimeout(seconds)
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False
        except (OSError, ssl.SSLError):
            return True

    def close(self) -> None:
        self.conn.close()


@dataclass
class Fleet:
    stage: Stage
    tmp: Path
    url: str
    rules: Path
    key: Path
    upstream: Upstream
    control: Path  # the control process's socket
    nodes: list[ProxyProcess] = field(default_factory=list)

    def node(self, name: str, options: str) -> ProxyProcess:
        """A ``surrogate run`` node on the store URL with ``options`` (control socket in its state dir)."""
        (self.tmp / name).mkdir()
        store = ["--store", f"{self.url}&{options}", "--key-file", str(self.key)]
        proxy = self.stage.proxy(self.rules, ["api.test"], workdir=self.tmp / name, start=False, args=store)
        proxy.start(timeout=60)
        wait_control(proxy, timeout=30)
        self.nodes.append(proxy)
        return proxy

    def api(self, sock: Path | None = None) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(sock or self.control))
        return httpx.Client(transport=transport, base_url="http://control", timeout=15)

    def ready(self, node: ProxyProcess) -> tuple[int, dict[str, Any]]:
        with self.api(node.state_dir / "control.sock") as api:
            r = api.get("/readyz")
            return r.status_code, r.json()

    def seen(self, prefix: str) -> list[str | None]:
        """The Authorization header of each request the upstream got under ``prefix``."""
        out = []
        for r in self.upstream.requests:
            if r.path.startswith(prefix):
                out.append(next((v for k, v in r.headers if k.lower() == "authorization"), None))
        return out


def _fleet(tmp: Path, cluster: Cluster) -> Iterator[Fleet]:
    url = cluster.database()
    with Stage(tmp) as st:
        st.every_canary = True  # the values come from the tests, through the control API
        upstream = st.upstream(["api.test"])
        rules_path = st.write(rules([egress("api.test", upstream.port)], claims=[]))
        key = tmp / "shared.key"
        sock = tmp / "control" / "api.sock"
        args = [sys.executable, "-m", "proxy", "control", "--rules", str(rules_path), "--state-dir",
                str(tmp / "control"), "--control-socket", str(sock), "--audit-file",
                str(tmp / "control-audit.jsonl"), "--store", url, "--key-file", str(key)]  # fmt: skip
        with open(tmp / "control.stderr", "wb") as err:
            control = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        st.defer(stop, control)
        wait_for(lambda: listening(sock), timeout=60)
        fleet = Fleet(st, tmp, url, rules_path, key, upstream, sock)
        yield fleet
    logs = {
        str(p): p.read_bytes() for p in tmp.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".stderr")
    }
    if cluster.pid() is None:  # a test that failed during its outage: the dump needs the server
        cluster.start()
    logs["pg_dump"] = cluster.dump(url)
    canary.assert_absent(logs)


def _until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``check()`` held (polled every 0.1 s); AssertionError after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except (httpx.HTTPError, OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def _fresh_get(
    fleet: Fleet, node: ProxyProcess, claim: str, token: str, path: str, ph: str
) -> tuple[int, str]:
    """One request on a new tunnel (a new CONNECT: the claim's token is checked again); a refused
    CONNECT gives its status and reason phrase (surrogate puts the reason code there)."""
    try:
        tunnel = Tunnel(node, fleet.upstream, claim, token)
    except OSError as e:
        refused = re.match(r"Tunnel connection failed: (\d+) (.*)", str(e))
        if refused is None:
            raise
        return int(refused[1]), refused[2]
    try:
        return tunnel.get(path, ph)
    finally:
        tunnel.close()


def _one_version(fleet: Fleet, *nodes: ProxyProcess) -> bool:
    """Every node ready at the same ``store_version``."""
    answers = [fleet.ready(n) for n in nodes]
    return all(status == 200 for status, _ in answers) and len({b["store_version"] for _, b in answers}) == 1


def _setup(fleet: Fleet, claim: str, value: str) -> tuple[str, str]:
    """A claim with credential ``gh`` = ``value`` through the control process: (token, placeholder)."""
    with fleet.api() as api:
        created = api.post("/v1/claims", json={"id": claim, "pool": "p"})
        assert created.status_code == 201, created.text
        put = api.put(f"/v1/claims/{claim}/credentials/gh", json={"hosts": ["api.test"], "value": value})
        assert put.status_code == 201, put.text
    return created.json()["proxy_token"], put.json()["placeholder"]


@pytest.fixture
def outage(tmp_path: Path, own_pg_cluster: Cluster) -> Iterator[tuple[Fleet, Cluster]]:
    for fleet in _fleet(tmp_path, own_pg_cluster):
        yield fleet, own_pg_cluster


def test_a_stopped_database_is_served_within_the_bound_then_refused_then_resynced(
    outage: tuple[Fleet, Cluster],
) -> None:
    fleet, cluster = outage
    strict = fleet.node("strict", f"stale={STALE:g}")
    notify = fleet.node("notify", f"sync=notify&poll=0.2&stale={STALE:g}")
    value, late = canary.make("outage"), canary.make("outagelate")
    token, ph = _setup(fleet, "sbx", value)
    open_tunnels = {n.workdir.name: Tunnel(n, fleet.upstream, "sbx", token) for n in (strict, notify)}
    for name, tunnel in open_tunnels.items():
        assert tunnel.get(f"/o/{name}/before", ph)[0] == 200
    with fleet.api() as api:  # acknowledged just before the outage: it must survive it
        r = api.put("/v1/claims/sbx/credentials/late", json={"hosts": ["api.test"], "value": late})
        assert r.status_code == 201, r.text
        late_ph = r.json()["placeholder"]
    for node in (strict, notify):
        _until(lambda n=node: fleet.ready(n)[0] == 200, 10, "ready before the outage")
    _until(lambda: _one_version(fleet, strict, notify), 5, "one fleet-wide store_version")

    stopping = time.monotonic()  # the nodes' last successful read is after this, less one poll
    cluster.stop()
    stopped = time.monotonic()
    for name, tunnel in open_tunnels.items():  # within the bound: the last-known-good copy
        status, body = tunnel.get(f"/o/{name}/within", ph)
        assert status == 200, body
    for node in (strict, notify):
        status, body = _fresh_get(fleet, node, "sbx", token, f"/o/{node.workdir.name}/within-new", ph)
        assert status == 200, body  # a new CONNECT too: its token was seen before
        assert fleet.ready(node)[0] == 200
    within = time.monotonic() - stopped
    assert within < STALE, f"the checks within the bound took {within:.1f}s"

    never = fleet.node("late-start", f"stale={STALE:g}")  # starts without its database
    _until(lambda: fleet.ready(never)[1].get("reason") == "never_synced", 10, "not ready: never_synced")
    assert fleet.ready(never)[0] == 503
    status, body = _fresh_get(fleet, never, "sbx", token, "/o/never/1", ph)
    assert status == 503 and "store_never_synced" in body, (status, body)

    for node in (strict, notify):

        def refused(n: ProxyProcess = node) -> bool:
            status, body = _fresh_get(fleet, n, "sbx", token, f"/o/{n.workdir.name}/past", ph)
            return status == 503 and "store_stale" in body

        _until(refused, STALE + 15, f"{node.workdir.name} refuses store_stale")
        # never before the bound (counted from the last read that succeeded: after `stopping`,
        # less one 0.2 s poll of the revocation loop)
        assert time.monotonic() - stopping >= STALE - 0.3, time.monotonic() - stopping
        status, body = fleet.ready(node)
        assert status == 503 and body["reason"] == "stale", body
        # the open tunnel was closed when the node went stale
        assert open_tunnels[node.workdir.name].closed_within(3)
    served_past = len(fleet.seen("/o/"))
    for node in (strict, notify):
        for n in range(3):
            status, body = _fresh_get(fleet, node, "sbx", token, f"/o/{node.workdir.name}/past-more/{n}", ph)
            assert status == 503 and "store_stale" in body
    assert len(fleet.seen("/o/")) == served_past  # nothing reached the upstream past the bound
    stale_events = [e for n in (strict, notify) for e in n.audit_events() if e.get("reason") == "store_stale"]
    assert stale_events and all(e["decision"] == "error" for e in stale_events)

    cluster.start()
    for node in (strict, notify, never):

        def serves(n: ProxyProcess = node) -> bool:
            return _fresh_get(fleet, n, "sbx", token, f"/o/{n.workdir.name}/after", late_ph)[0] == 200

        _until(serves, 90, f"{node.workdir.name} resyncs")
        _until(lambda n=node: fleet.ready(n)[0] == 200, 10, "ready again")
    _until(lambda: _one_version(fleet, strict, notify, never), 5, "one fleet-wide store_version")
    assert set(fleet.seen("/o/never/")) == set() and fleet.seen("/o/late-start/after") == [f"Bearer {late}"]
    newer = canary.make("outagenew")
    with fleet.api() as api:
        _until(lambda: api.patch("/v1/claims/sbx/credentials/gh", json={"value": newer}).status_code == 200,
               60, "the control process writes again")  # fmt: skip
    for node in (strict, notify, never):  # the very next request on every node
        assert _fresh_get(fleet, node, "sbx", token, f"/o/{node.workdir.name}/newer", ph)[0] == 200
    assert {h for n in ("strict", "notify", "late-start") for h in fleet.seen(f"/o/{n}/newer")} == {
        f"Bearer {newer}"
    }
    assert fleet.seen("/o/strict/within") == [f"Bearer {value}"] * 2  # the open tunnel and a new one
    for tunnel in open_tunnels.values():
        tunnel.close()


@pytest.fixture
def fleet(tmp_path: Path, pg_cluster: Cluster) -> Iterator[Fleet]:
    yield from _fleet(tmp_path, pg_cluster)


def test_a_patch_through_one_node_reaches_the_open_tunnel_on_the_other(fleet: Fleet) -> None:
    a = fleet.node("a", "stale=30")
    b = fleet.node("b", "sync=notify&poll=0.2")
    first, second = canary.make("patchone"), canary.make("patchtwo")
    token, ph = _setup(fleet, "sbx", first)
    tunnel = Tunnel(b, fleet.upstream, "sbx", token)
    try:
        assert tunnel.get("/p/1", ph)[0] == 200
        with fleet.api(a.state_dir / "control.sock") as api:  # written through node a
            r = api.patch("/v1/claims/sbx/credentials/gh", json={"value": second})
            assert r.status_code == 200, r.text
        # node b hears of it by NOTIFY (or its 0.2 s poll): on a loaded machine that may come
        # after the next request, so the open tunnel asks again until it carries the new value
        deadline = time.monotonic() + 10
        while True:
            assert tunnel.get("/p/2", ph)[0] == 200  # the same connection (auto_open is off)
            if fleet.seen("/p/")[-1] == f"Bearer {second}" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        seen = fleet.seen("/p/")
        assert seen[0] == f"Bearer {first}" and seen[-1] == f"Bearer {second}", seen
        assert set(seen) == {f"Bearer {first}", f"Bearer {second}"}
    finally:
        tunnel.close()  # a tunnel left open fails a later test when the collector finds it


REVOCATIONS: list[tuple[str, Callable[[httpx.Client, str], httpx.Response]]] = [
    ("credential-delete", lambda api, c: api.delete(f"/v1/claims/{c}/credentials/gh")),
    ("claim-delete", lambda api, c: api.delete(f"/v1/claims/{c}")),
    ("token-rotation", lambda api, c: api.post(f"/v1/claims/{c}/token")),
]


def test_a_revocation_closes_the_claims_open_tunnels_on_every_node(fleet: Fleet) -> None:
    nodes = [fleet.node("a", "stale=30"), fleet.node("b", "sync=notify&poll=0.2")]
    tunnels: dict[str, list[Tunnel]] = {}
    kept: list[Tunnel] = []  # another claim's tunnels: a revocation of one claim leaves them open
    bystander_token, bystander_ph = _setup(fleet, "other", canary.make("bystander"))
    for what, _ in REVOCATIONS:
        token, ph = _setup(fleet, what, canary.make(what.replace("-", "")))
        tunnels[what] = [Tunnel(n, fleet.upstream, what, token) for n in nodes]
        for t in tunnels[what]:
            assert t.get(f"/r/{what}/1", ph)[0] == 200
    for n in nodes:
        kept.append(Tunnel(n, fleet.upstream, "other", bystander_token))
        assert kept[-1].get("/r/other/1", bystander_ph)[0] == 200
    with fleet.api() as api:
        for what, revoke in REVOCATIONS:
            r = revoke(api, what)
            assert r.status_code in (200, 204), r.text
            for node, t in zip(nodes, tunnels[what], strict=True):
                assert t.closed_within(5), f"{what}: the tunnel on node {node.workdir.name} stayed open"
    for t in kept:
        assert t.get("/r/other/2", bystander_ph)[0] == 200
    for t in [*kept, *(t for ts in tunnels.values() for t in ts)]:
        t.close()


@pytest.mark.parametrize("process", ["run", "control"])
def test_acknowledged_writes_survive_kill_9_at_a_random_moment_mid_write(
    tmp_path: Path, pg_cluster: Cluster, process: str
) -> None:
    """A loop of PUTs through a ``surrogate run`` node's control socket, or through ``surrogate
    control``, SIGKILLed by a timer at a random moment (mid-request, mid-commit), three times:
    every write the API acknowledged is there afterwards, read through a fresh process's store,
    and the store holds no half row (every credential decrypts; none is missing its claim)."""
    url = pg_cluster.database()
    key = tmp_path / "shared.key"
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(rules([egress("api.test", 443)], claims=[]))
    rng = random.Random(14)
    acked: dict[str, str] = {}
    tried: dict[str, set[str]] = {}  # per name: values sent after its last acknowledged one
    values = [canary.make(f"k9{process}{n}") for n in range(5)]
    for round_ in range(3):
        state = tmp_path / f"state{round_}"
        sock = state / ("control.sock" if process == "run" else "api.sock")
        audit_file = tmp_path / f"audit{round_}.jsonl"
        args = [sys.executable, "-m", "proxy", process, "--rules", str(rules_path), "--state-dir", str(state),
                "--audit-file", str(audit_file), "--store", url, "--key-file", str(key)]  # fmt: skip
        args += (
            ["--listen", f"127.0.0.1:{free_port()}"] if process == "run" else ["--control-socket", str(sock)]
        )
        with open(tmp_path / f"{process}{round_}.stderr", "wb") as err:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(lambda s=sock: listening(s), timeout=60)
            transport = httpx.HTTPTransport(uds=str(sock))
            with httpx.Client(transport=transport, base_url="http://control", timeout=10) as api:
                if round_ == 0:
                    assert api.post("/v1/claims", json={"id": "c", "pool": "p"}).status_code == 201
                killer = threading.Timer(rng.uniform(0.3, 2.0), os.kill, (proc.pid, signal.SIGKILL))
                killer.start()
                for n in range(10_000):
                    name, value = f"k{n % 5}", f"{values[n % 5]}-{round_}-{n}"
                    tried.setdefault(name, set()).add(value)
                    try:
                        r = api.put(
                            f"/v1/claims/c/credentials/{name}", json={"hosts": ["api.test"], "value": value}
                        )
                    except httpx.TransportError:
                        break  # killed: this write was never acknowledged
                    if r.status_code not in (200, 201):
                        # the supervisor was killed under its worker (a 500 naming a broken pipe):
                        # not acknowledged; only ever after the kill
                        assert not killer.is_alive(), r.text
                        break
                    acked[name], tried[name] = value, set()
                killer.join()
        finally:
            stop(proc, signal.SIGKILL)
    assert acked
    with PostgresStore.open(url, KeyRing.load_or_create(key)) as store:
        for name, value in acked.items():  # the acknowledged value, or a later one sent before the kill
            assert store.secret("c", name)[0].decode() in {value} | tried.get(name, set()), name
        claims, creds = store.snapshot()
        assert [c.id for c in claims] == ["c"] and {r.claim_id for r in creds} == {"c"}
        for r in creds:  # every stored row decrypts: no half-written value
            store.secret(r.claim_id, r.name)
    logs = {
        str(p): p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".stderr")
    }
    logs["pg_dump"] = pg_cluster.dump(url)
    canary.assert_absent(logs)
