"""Two processes, one PostgreSQL store (issue 14's foundation): a credential written through the
control API of ``surrogate control --store postgresql://…`` is used by the next request through
``surrogate run --store postgresql://…``, a second process with its own state dir that shares
only the database and the key file; a PATCH reaches the open tunnel, a delete and a token
rotation end it. Afterwards a ``pg_dump`` of the database, the server's data directory (its WAL
included, tests/pg.py) and every log are scanned for the secrets: none is there.
"""

from __future__ import annotations

import random
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import canary
import httpx
import pytest
from harness import ROOT, ProxyProcess
from pg import Cluster
from servers import Upstream
from test_control_process import listening, start_control, stop, wait_for
from world import Stage, egress, rules

from proxy.store.keyring import KeyRing
from proxy.store.postgres import PostgresStore

pytestmark = pytest.mark.e2e


@dataclass
class Fleet:
    tmp: Path
    url: str  # the store URL (the password in a password_file)
    upstream: Upstream
    proxy: ProxyProcess
    control: subprocess.Popen[bytes]
    socket: Path

    def api(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://control", timeout=10)

    def client(self, claim: str, token: str) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        return httpx.Client(proxy=self.proxy.url(claim, token), verify=ctx, timeout=10)

    def target(self, path: str) -> str:
        return f"https://api.test:{self.upstream.port}{path}"

    def seen(self, prefix: str) -> list[dict[str, str]]:
        """The headers (lower-cased names) of each request the upstream got under ``prefix``."""
        return [
            {k.lower(): v for k, v in r.headers} for r in self.upstream.requests if r.path.startswith(prefix)
        ]


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path, pg_cluster: Cluster) -> Iterator[Fleet]:
    """``surrogate control`` and ``surrogate run`` (``--workers`` from the test's parameter, 1 by
    default) on one database, each with its own state dir."""
    url = pg_cluster.database()
    with Stage(tmp_path) as st:
        st.every_canary = True  # the values come from the tests, through the control API
        upstream = st.upstream(["api.test"])
        rules_path = st.write(rules([egress("api.test", upstream.port)], claims=[]))
        key = tmp_path / "shared.key"  # the one file besides the database that the nodes share
        store = ["--store", url, "--key-file", str(key)]
        (tmp_path / "node").mkdir()
        workers = getattr(request, "param", 1)
        proxy = st.proxy(rules_path, ["api.test"], workdir=tmp_path / "node", start=False,
                         args=[*store, "--control-socket", "none"], workers=workers)  # fmt: skip
        sock = tmp_path / "control" / "api.sock"
        control_args = [sys.executable, "-m", "proxy", "control", "--rules", str(rules_path),
                        "--state-dir", str(tmp_path / "control"), "--control-socket", str(sock),
                        "--audit-file", str(tmp_path / "control-audit.jsonl"), *store]  # fmt: skip
        with open(tmp_path / "control.stderr", "wb") as err:
            control = subprocess.Popen(control_args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        st.defer(stop, control)  # stopped first, then the proxy, then the upstream
        wait_for(lambda: listening(sock), timeout=30)
        proxy.start(timeout=30)
        yield Fleet(tmp_path, url, upstream, proxy, control, sock)
    logs = {
        p.name: p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".stderr")
    }
    logs["pg_dump"] = pg_cluster.dump(url)
    canary.assert_absent(logs)


@pytest.mark.parametrize("fleet", [1, 2], ids=["one-worker", "two-workers"], indirect=True)
def test_a_credential_written_through_one_process_is_used_by_the_next_request_of_another(
    fleet: Fleet,
) -> None:
    first, second = canary.make("fleetone"), canary.make("fleettwo")
    with fleet.api() as api:
        created = api.post("/v1/claims", json={"id": "sbx", "pool": "p"})
        assert created.status_code == 201, created.text
        token = created.json()["proxy_token"]
        put = api.put("/v1/claims/sbx/credentials/gh", json={"hosts": ["api.test"], "value": first})
        assert put.status_code == 201, put.text
        placeholder = put.json()["placeholder"]
        with fleet.client("sbx", token) as client:
            auth = {"Authorization": f"Bearer {placeholder}"}
            r = client.get(fleet.target("/fleet/1"), headers=auth)  # the very next request
            assert r.status_code == 200 and first not in r.text
            patched = api.patch("/v1/claims/sbx/credentials/gh", json={"value": second})
            assert patched.status_code == 200, patched.text
            assert client.get(fleet.target("/fleet/2"), headers=auth).status_code == 200  # same tunnel
            assert api.delete("/v1/claims/sbx/credentials/gh").status_code == 204
            try:  # a credential delete closes the claim's tunnels (issue 14): refused or closed, never sent
                gone = client.get(fleet.target("/fleet/3"), headers=auth)
                assert gone.status_code == 403 and "placeholder" in gone.text  # unknown now: never sent
            except httpx.RemoteProtocolError:
                pass
            rotated = api.post("/v1/claims/sbx/token")
            assert rotated.status_code == 200, rotated.text
            with pytest.raises(httpx.HTTPError):  # the old token's tunnel is closed / refused
                for n in range(20):
                    r = client.get(fleet.target(f"/fleet/old/{n}"))
                    if r.status_code == 407:
                        raise httpx.ProxyError("407")
                    time.sleep(0.1)
    seen = fleet.seen("/fleet/")
    assert [h.get("authorization") for h in seen[:2]] == [f"Bearer {first}", f"Bearer {second}"]
    assert len(fleet.seen("/fleet/3")) == 0 and len(fleet.seen("/fleet/old/")) <= 1


def test_the_proxy_keeps_serving_its_last_index_when_the_control_process_dies(fleet: Fleet) -> None:
    value = canary.make("fleetkill")
    with fleet.api() as api:
        token = api.post("/v1/claims", json={"id": "k", "pool": "p"}).json()["proxy_token"]
        put = api.put("/v1/claims/k/credentials/gh", json={"hosts": ["api.test"], "value": value})
        assert put.status_code == 201, put.text
    stop(fleet.control, signal.SIGKILL)  # acknowledged, then the writer is gone: the write is not
    with fleet.client("k", token) as client:
        auth = {"Authorization": f"Bearer {put.json()['placeholder']}"}
        assert client.get(fleet.target("/kill/1"), headers=auth).status_code == 200
    assert fleet.seen("/kill/1")[0]["authorization"] == f"Bearer {value}"


def test_acknowledged_control_writes_survive_kill_9_of_the_control_process(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    """``surrogate control --store postgresql://…`` killed with SIGKILL at random points, five
    times: every write the API acknowledged (201/200) is in the database, readable."""
    url = pg_cluster.database()
    key = tmp_path / "shared.key"
    sock = tmp_path / "state" / "control.sock"
    rng = random.Random(11)
    acked: dict[str, str] = {}
    values = [canary.make(f"kill{n}") for n in range(7)]
    for round_ in range(5):
        proc = start_control(tmp_path, "--store", url, "--key-file", str(key))
        try:
            if sock.exists():
                sock.unlink()  # the killed run's socket file
            wait_for(lambda: listening(sock), timeout=30)
            transport = httpx.HTTPTransport(uds=str(sock))
            with httpx.Client(transport=transport, base_url="http://control", timeout=10) as api:
                if round_ == 0:
                    assert api.post("/v1/claims", json={"id": "c", "pool": "p"}).status_code == 201
                for n in range(rng.randint(5, 30)):
                    name, value = f"k{n % 7}", f"{values[n % 7]}-{round_}-{n}"
                    r = api.put(
                        f"/v1/claims/c/credentials/{name}", json={"hosts": ["api.test"], "value": value}
                    )
                    assert r.status_code in (200, 201), r.text
                    acked[name] = value
        finally:
            stop(proc, signal.SIGKILL)
    with PostgresStore.open(url, KeyRing.load_or_create(key)) as store:
        assert {name: store.secret("c", name)[0].decode() for name in acked} == acked
