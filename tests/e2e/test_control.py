"""The control plane end to end: a real proxy process, its control socket, a real upstream.

A credential pushed through the API is used by the very next request, inside an already-open
keep-alive tunnel; deleting the claim closes that tunnel and its token stops working at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import canary
import httpx
import pytest
from harness import ROOT
from world import Stage, control, egress, rules

pytestmark = pytest.mark.e2e


class World:
    def __init__(self, st: Stage) -> None:
        self.upstream = st.upstream(["api.test", "other.test"])
        port = self.upstream.port
        text = rules([egress("api.test", port), egress("other.test", port)], claims=[])
        self.proxy = st.proxy(text, ["api.test", "other.test"], control=True)
        self.canaries = st.canaries  # values a test pushed, checked for when the stage closes

    @property
    def socket(self) -> Path:
        return self.proxy.state_dir / "control.sock"

    def api(self) -> httpx.Client:
        return control(self.proxy)

    def canary(self) -> str:
        value = canary.make("ctl")
        self.canaries.append(value)
        return value

    def url(self, path: str, host: str = "api.test") -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    def client(self, claim: str, token: str) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        return httpx.Client(proxy=self.proxy.url(claim, token), verify=ctx, timeout=10)

    def sent(self, path: str, header: str) -> list[str]:
        return [
            v
            for r in self.upstream.requests
            if r.path == path
            for k, v in r.headers
            if k.lower() == header.lower()
        ]


@contextlib.contextmanager
def control_world(tmp: Path) -> Iterator[World]:
    """A started proxy (its control socket up) with no claim, in front of one upstream."""
    with Stage(tmp) as st:
        w = World(st)
        # No value in the store file, its WAL, the audit file or the proxy's stderr.
        st.scanned += [w.proxy.state_dir / f"store.sqlite3{x}" for x in ("", "-wal", "-shm")]
        yield w


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with control_world(tmp_path_factory.mktemp("control")) as w:
        yield w


def test_api_write_is_used_by_the_next_request_on_the_same_connection(world: World) -> None:
    first, second = world.canary(), world.canary()
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "live", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/live/credentials/gh", json={"hosts": ["api.test"], "value": first})
        assert r.status_code == 201, r.text
        placeholder = r.json()["placeholder"]
        with world.client("live", token) as client:
            assert client.get(world.url("/ctl/1"), headers={"X-Api-Key": placeholder}).status_code == 200
            r = api.patch(
                "/v1/claims/live/credentials/gh", json={"value": second}, headers={"If-Match": '"1"'}
            )
            assert r.status_code == 200 and r.headers["etag"] == '"2"'
            # the keep-alive tunnel opened above carries the next request
            assert client.get(world.url("/ctl/2"), headers={"X-Api-Key": placeholder}).status_code == 200
            assert client.get(world.url("/ctl/3"), headers={"X-Api-Key": placeholder}).status_code == 200
    assert world.sent("/ctl/1", "X-Api-Key") == [first]
    assert world.sent("/ctl/2", "X-Api-Key") == [second]
    event = world.proxy.wait_event(path="/ctl/2")
    assert event["claim"] == "live" and event["credentials"] == [{"name": "gh", "version": 2}]
    with world.api() as api:
        assert api.get("/v1/claims/live/credentials/gh").json()["last_used_at"] is not None


def test_deleting_a_claim_closes_its_tunnel_and_revokes_its_token(world: World) -> None:
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "doomed", "pool": "p"}).json()["proxy_token"]
        raw = world.proxy.url("doomed", token)
        with world.client("doomed", token) as client:
            assert client.get(world.url("/doomed/1")).status_code == 200
            assert api.delete("/v1/claims/doomed").status_code == 204
            time.sleep(0.6)  # the proxy polls the store every 0.2 s for idle tunnels
            with pytest.raises(httpx.TransportError):
                # the old connection was closed by the proxy; httpx must reconnect, and the new
                # CONNECT is refused with 407
                client.get(world.url("/doomed/2"))
    done = subprocess.run(
        ["curl", "-sS", "-x", raw, "--cacert", str(world.proxy.ca_pem), world.url("/doomed/3")],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert "407" in done.stderr
    assert [r.path for r in world.upstream.requests if r.path.startswith("/doomed")] == ["/doomed/1"]


def test_expired_credential_is_refused_not_injected(world: World) -> None:
    value = world.canary()
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "old", "pool": "p"}).json()["proxy_token"]
        r = api.put(
            "/v1/claims/old/credentials/k",
            json={
                "hosts": ["api.test"],
                "value": value,
                "inject": {"set_header": "X-Injected"},
                "expires_at": "2020-01-01T00:00:00Z",
            },
        )
        assert r.status_code == 201
    with world.client("old", token) as client:
        r = client.get(world.url("/expired"))
    assert r.status_code == 403 and r.json()["error"] == "credential_expired"
    assert [x for x in world.upstream.requests if x.path == "/expired"] == []


def test_one_claim_cannot_use_another_claims_placeholder(world: World) -> None:
    value = world.canary()
    with world.api() as api:
        api.post("/v1/claims", json={"id": "alice", "pool": "p"})
        ph = api.put("/v1/claims/alice/credentials/k", json={"hosts": ["api.test"], "value": value}).json()[
            "placeholder"
        ]
        mallory = api.post("/v1/claims", json={"id": "mallory", "pool": "p"}).json()["proxy_token"]
    with world.client("mallory", mallory) as client:
        refused = client.get(world.url("/cross"), headers={"X-Api-Key": ph})
    # alice's placeholder carries surrogate's checksum: from mallory it is refused as forged, and
    # neither alice's secret nor her placeholder reaches the upstream
    assert (refused.status_code, refused.json()["error"]) == (403, "forged_placeholder")
    assert world.sent("/cross", "X-Api-Key") == []


def test_parallel_if_match_patches_have_exactly_one_winner(world: World) -> None:
    with world.api() as api:
        api.post("/v1/claims", json={"id": "race", "pool": "p"})
        api.put("/v1/claims/race/credentials/k", json={"hosts": ["api.test"], "value": world.canary()})
    values = [world.canary() for _ in range(100)]

    async def race() -> list[int]:
        transport = httpx.AsyncHTTPTransport(uds=str(world.socket))
        async with httpx.AsyncClient(transport=transport, base_url="http://control", timeout=30) as api:
            rs = await asyncio.gather(
                *[
                    api.patch("/v1/claims/race/credentials/k", json={"value": v}, headers={"If-Match": '"1"'})
                    for v in values
                ]
            )
        return [r.status_code for r in rs]

    codes = asyncio.run(race())
    assert sorted(codes) == [200] + [412] * 99
    with world.api() as api:
        assert api.get("/v1/claims/race/credentials/k").json()["version"] == 2


def test_cli_client_reads_the_value_from_stdin_never_argv(world: World) -> None:
    value = world.canary()
    base = [sys.executable, "-m", "proxy"]
    state = ["--state-dir", str(world.proxy.state_dir)]

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *args, *state],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
            check=False,
        )

    created = run("claims", "create", "--pool", "p", "--id", "cli")
    assert created.returncode == 0, created.stderr
    put = run("creds", "put", "cli", "k", "--host", "api.test", "--value-file", "-", stdin=value + "\n")
    assert put.returncode == 0, put.stderr
    assert value not in put.stdout and '"version": 1' in put.stdout
    bad = run("creds", "put", "cli", "k2", "--host", "nowhere.test", "--value-file", "-", stdin=value)
    assert bad.returncode == 1 and "not covered" in bad.stderr and value not in bad.stderr
    with world.api() as api:
        assert api.get("/v1/claims/cli/credentials/k").json()["hosts"] == ["api.test"]


def test_slots_written_through_the_api_are_used_by_the_next_request(world: World) -> None:
    """Issue 13 class 4 for store credentials: the default slots leave Origin alone, named slots
    (a PATCH, acknowledged) replace them from the next request on the same connection."""
    value = world.canary()
    with world.api() as api:
        token = api.post("/v1/claims", json={"id": "slots", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/slots/credentials/svc", json={"hosts": ["api.test"], "value": value})
        placeholder = r.json()["placeholder"]
        both = {"Origin": f"https://{placeholder}.app.test", "X-Api-Key": placeholder}
        with world.client("slots", token) as client:
            assert client.get(world.url("/slot/1"), headers=both).status_code == 200
            r = api.patch("/v1/claims/slots/credentials/svc", json={"headers": ["DD-API-KEY"]})
            assert r.status_code == 200 and r.json()["headers"] == ["dd-api-key"]
            sent = {**both, "DD-API-KEY": placeholder}
            assert client.get(world.url("/slot/2"), headers=sent).status_code == 200
    assert world.sent("/slot/1", "Origin") == [f"https://{placeholder}.app.test"]
    assert world.sent("/slot/1", "X-Api-Key") == [value]
    assert world.sent("/slot/2", "X-Api-Key") == [placeholder]  # no longer one of its slots
    assert world.sent("/slot/2", "DD-API-KEY") == [value]
    event = world.proxy.wait_event(path="/slot/2")
    assert event["carried_on"] == [{"name": "svc", "surface": "header"}]
