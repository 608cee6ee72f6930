"""Two ``surrogate run`` nodes and one ``surrogate control`` on one PostgreSQL store (issue 14,
fleet-wide limits): each node has its own state dir and shares only the database and the key
file, as two hosts of a fleet do.

- A credential's ``max_requests: N`` is spent exactly N times by concurrent clients on both
  nodes together: the upstream counts N requests that carried the secret, every other request
  is refused ``403 credential_budget_spent`` before anything is sent.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
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
from test_control_process import listening, stop, wait_for
from world import Stage, egress, rules

pytestmark = pytest.mark.e2e


@dataclass
class TwoNodes:
    upstream: Upstream
    nodes: tuple[ProxyProcess, ProxyProcess]
    socket: Path

    def api(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket))
        return httpx.Client(transport=transport, base_url="http://control", timeout=10)

    def client(self, node: int, claim: str, token: str) -> httpx.Client:
        proxy = self.nodes[node]
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        return httpx.Client(proxy=proxy.url(claim, token), verify=ctx, timeout=20)

    def target(self, path: str) -> str:
        return f"https://api.test:{self.upstream.port}{path}"


@pytest.fixture
def two_nodes(tmp_path: Path, pg_cluster: Cluster) -> Iterator[TwoNodes]:
    url = pg_cluster.database()
    with Stage(tmp_path) as st:
        st.every_canary = True  # the values come from the tests, through the control API
        upstream = st.upstream(["api.test"])
        rules_path = st.write(rules([egress("api.test", upstream.port)], claims=[]))
        key = tmp_path / "shared.key"
        store = ["--store", url, "--key-file", str(key)]
        sock = tmp_path / "control" / "api.sock"
        control_args = [sys.executable, "-m", "proxy", "control", "--rules", str(rules_path),
                        "--state-dir", str(tmp_path / "control"), "--control-socket", str(sock),
                        "--audit-file", str(tmp_path / "control-audit.jsonl"), *store]  # fmt: skip
        with open(tmp_path / "control.stderr", "wb") as err:
            control = subprocess.Popen(control_args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        st.defer(stop, control)
        wait_for(lambda: listening(sock), timeout=30)  # the control process made the schema and key
        nodes = []
        for name in ("node-a", "node-b"):
            (tmp_path / name).mkdir()
            nodes.append(st.proxy(rules_path, ["api.test"], workdir=tmp_path / name, start=False,
                                  args=[*store, "--control-socket", "none"]))  # fmt: skip
        for node in nodes:
            node.start(timeout=30)
        yield TwoNodes(upstream, (nodes[0], nodes[1]), sock)
    logs = {
        p.name: p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".stderr")
    }
    logs["pg_dump"] = pg_cluster.dump(url)
    canary.assert_absent(logs)


def test_max_requests_is_spent_exactly_n_times_by_concurrent_clients_on_both_nodes(
    two_nodes: TwoNodes,
) -> None:
    value, budget, per_node, threads_per_node = canary.make("fleetbudget"), 7, 12, 4
    with two_nodes.api() as api:
        token = api.post("/v1/claims", json={"id": "b", "pool": "p"}).json()["proxy_token"]
        put = api.put("/v1/claims/b/credentials/gh",
                      json={"hosts": ["api.test"], "value": value, "max_requests": budget})  # fmt: skip
        assert put.status_code == 201, put.text
    auth = {"Authorization": f"Bearer {put.json()['placeholder']}"}
    statuses: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2 * threads_per_node)

    def hammer(node: int, t: int) -> None:
        with two_nodes.client(node, "b", token) as client:
            client.get(two_nodes.target("/warm"))  # the tunnel is open before the race starts
            barrier.wait()
            for n in range(per_node // threads_per_node):
                r = client.get(two_nodes.target(f"/budget/{node}/{t}/{n}"), headers=auth)
                with lock:
                    statuses.append(r.status_code)
                assert value not in r.text

    workers = [
        threading.Thread(target=hammer, args=(node, t)) for node in (0, 1) for t in range(threads_per_node)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    carried = [r for r in two_nodes.upstream.requests if r.path.startswith("/budget/")]
    assert len(carried) == budget, [r.path for r in carried]
    assert all(
        dict((k.lower(), v) for k, v in r.headers)["authorization"] == f"Bearer {value}" for r in carried
    )
    assert sorted(statuses) == [200] * budget + [403] * (2 * per_node - budget)


def test_concurrent_oauth_refreshes_on_both_nodes_call_the_token_endpoint_once(two_nodes: TwoNodes) -> None:
    """Six refreshes at once, three through each node, with the refresh token's placeholder: the
    token endpoint (slow, 0.5 s) is called once, with the real refresh token; the five that
    waited get the same placeholders from the proxy (addons/refresh.py) and no real token; the
    next refresh, later, goes to the endpoint with the rotated refresh token."""
    refresh, access = canary.make("fleetrefresh"), canary.make("fleetaccess")
    up = two_nodes.upstream
    up.oauth_refresh = refresh

    def slow(issued: dict[str, str], _presented: str) -> tuple[int, object]:
        time.sleep(0.5)  # the others arrive while this refresh runs
        return 200, {"access_token": issued["access_token"], "refresh_token": issued["refresh_token"],
                     "token_type": "Bearer", "expires_in": 3600}  # fmt: skip

    up.oauth_reply = slow
    with two_nodes.api() as api:
        token = api.post("/v1/claims", json={"id": "oa", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/oa/credentials/access", json={"hosts": ["api.test"], "value": access})
        assert r.status_code == 201, r.text
        spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
        declared = {"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec}
        r2 = api.put("/v1/claims/oa/credentials/refresh", json=declared)
        assert r2.status_code == 201, r2.text
    ph_access, ph_refresh = r.json()["placeholder"], r2.json()["placeholder"]
    answers: list[httpx.Response] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def refresh_once(node: int) -> None:
        with two_nodes.client(node, "oa", token) as client:
            client.get(two_nodes.target("/warm"))
            barrier.wait()
            got = client.post(two_nodes.target("/oauth/token"),
                              data={"grant_type": "refresh_token", "refresh_token": ph_refresh})  # fmt: skip
            with lock:
                answers.append(got)

    workers = [threading.Thread(target=refresh_once, args=(i % 2,)) for i in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert up.oauth_seen == [refresh], "the token endpoint is called once, with the real refresh token"
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    issued = up.oauth_issued[0]
    for a in answers:
        doc = a.json()
        assert doc["access_token"] == ph_access and doc["refresh_token"] == ph_refresh
        assert doc["token_type"] == "Bearer" and 3500 <= doc["expires_in"] <= 3600
        assert not any(v in a.text for v in (refresh, access, *issued.values()))
    with two_nodes.client(1, "oa", token) as client:  # later: a refresh of its own, rotated token
        later = client.post(two_nodes.target("/oauth/token"),
                            data={"grant_type": "refresh_token", "refresh_token": ph_refresh})  # fmt: skip
    assert later.status_code == 200 and up.oauth_seen == [refresh, issued["refresh_token"]]


def test_a_slow_refresh_body_cannot_hold_the_lease_past_its_ttl_into_a_second_refresh(
    two_nodes: TwoNodes,
) -> None:
    """r-fleet: a hostile sandbox sends its refresh body one piece every few seconds through node
    A (the lease is taken at the headers), while a second refresh waits on node B. The lease
    expires (addons/refresh.py TTL), B takes it and calls the endpoint; A's body must never
    complete a second call with the same refresh token: A is aborted at SEND_BY, the endpoint
    sees exactly one refresh."""
    from addons.refresh import SEND_BY, TTL

    refresh, access = canary.make("slowrefresh"), canary.make("slowaccess")
    up = two_nodes.upstream
    up.oauth_refresh = refresh
    with two_nodes.api() as api:
        token = api.post("/v1/claims", json={"id": "sl", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/sl/credentials/access", json={"hosts": ["api.test"], "value": access})
        assert r.status_code == 201, r.text
        spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
        declared = {"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec}
        r2 = api.put("/v1/claims/sl/credentials/refresh", json=declared)
        assert r2.status_code == 201, r2.text
    ph_refresh = r2.json()["placeholder"]
    body = f"grant_type=refresh_token&refresh_token={ph_refresh}".encode()
    pieces = [body[:10]] + [body[i : i + 8] for i in range(10, len(body), 8)]
    nap = (TTL + 6) / (len(pieces) - 1)  # the last piece lands past the lease's ttl
    assert nap < 25  # under the upstream's read timeout: only the proxy may cut it
    slow_result: list[object] = []

    def slow_loris() -> None:
        def trickle() -> Iterator[bytes]:
            yield pieces[0]
            for p in pieces[1:]:
                time.sleep(nap)
                yield p

        with two_nodes.client(0, "sl", token) as client:
            try:
                got = client.post(two_nodes.target("/oauth/token"), content=trickle(), timeout=TTL + 30,
                                  headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
                slow_result.append(got.status_code)
            except httpx.HTTPError as e:
                slow_result.append(type(e).__name__)

    slow = threading.Thread(target=slow_loris)
    slow.start()
    time.sleep(2)  # A holds the lease now
    with two_nodes.client(1, "sl", token) as client:
        waiter = client.post(two_nodes.target("/oauth/token"), timeout=TTL + 30,
                             data={"grant_type": "refresh_token", "refresh_token": ph_refresh})  # fmt: skip
    slow.join()
    assert waiter.status_code == 200, waiter.text
    assert up.oauth_seen == [refresh], f"one refresh, not {len(up.oauth_seen)}; slow: {slow_result}"
    assert slow_result and slow_result[0] != 200, slow_result
    assert SEND_BY < TTL


def test_a_get_to_the_token_endpoint_is_never_answered_with_a_concurrent_refreshs_tokens(
    two_nodes: TwoNodes,
) -> None:
    """r-fleet: while a refresh runs on node A (slow endpoint), a GET to the token endpoint path
    on node B waits for the lease; once the refresh finished it must not get a proxy-made token
    response (RFC 6749 §3.2: the endpoint takes POST only): it is refused 503, nothing sent."""
    refresh, access = canary.make("getrefresh"), canary.make("getaccess")
    up = two_nodes.upstream
    up.oauth_refresh = refresh

    def slow(issued: dict[str, str], _presented: str) -> tuple[int, object]:
        time.sleep(1.5)  # the GET arrives while this refresh runs
        return 200, {"access_token": issued["access_token"], "refresh_token": issued["refresh_token"],
                     "token_type": "Bearer", "expires_in": 3600}  # fmt: skip

    up.oauth_reply = slow
    with two_nodes.api() as api:
        token = api.post("/v1/claims", json={"id": "gt", "pool": "p"}).json()["proxy_token"]
        r = api.put("/v1/claims/gt/credentials/access", json={"hosts": ["api.test"], "value": access})
        assert r.status_code == 201, r.text
        spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
        declared = {"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec}
        r2 = api.put("/v1/claims/gt/credentials/refresh", json=declared)
        assert r2.status_code == 201, r2.text
    ph_access, ph_refresh = r.json()["placeholder"], r2.json()["placeholder"]
    posted: list[httpx.Response] = []

    def post() -> None:
        with two_nodes.client(0, "gt", token) as client:
            form = {"grant_type": "refresh_token", "refresh_token": ph_refresh}
            posted.append(client.post(two_nodes.target("/oauth/token"), data=form))

    with two_nodes.client(1, "gt", token) as client:
        client.get(two_nodes.target("/warm"))
        holder = threading.Thread(target=post)
        holder.start()
        time.sleep(0.7)
        got = client.get(two_nodes.target("/oauth/token?x=1"))
        holder.join()
    assert posted and posted[0].status_code == 200
    assert up.oauth_seen == [refresh]
    assert got.status_code == 503, (got.status_code, got.text)
    assert ph_access not in got.text and "credential_unavailable" in got.text


def _oauth_claim(api: httpx.Client, claim: str, refresh: str, access: str) -> tuple[str, str]:
    token = api.post("/v1/claims", json={"id": claim, "pool": "p"}).json()["proxy_token"]
    r = api.put(f"/v1/claims/{claim}/credentials/access", json={"hosts": ["api.test"], "value": access})
    assert r.status_code == 201, r.text
    spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
    declared = {"hosts": ["api.test"], "value": refresh, "surfaces": ["body"], "oauth": spec}
    r2 = api.put(f"/v1/claims/{claim}/credentials/refresh", json=declared)
    assert r2.status_code == 201, r2.text
    return token, r2.json()["placeholder"]


def test_one_claims_waiting_refreshes_cannot_starve_another_claims_refresh(two_nodes: TwoNodes) -> None:
    """r-fleet: claim X holds its refresh lease (a slow endpoint, 8 s) and piles up more waiting
    refreshes on the same node than the event loop's default thread pool has threads; claim Y's
    refresh on that node must still go through at once (its lease is its own), not queue behind
    X's waiters for their whole wait."""
    x_refresh, y_refresh = canary.make("starvex"), canary.make("starvey")
    up = two_nodes.upstream
    up.oauth_refresh = x_refresh  # X's first refresh token; Y's is known below

    def reply(issued: dict[str, str], presented: str) -> tuple[int, object]:
        if presented == x_refresh:
            time.sleep(8)
        return 200, {"access_token": issued["access_token"], "refresh_token": issued["refresh_token"],
                     "token_type": "Bearer", "expires_in": 3600}  # fmt: skip

    up.oauth_reply = reply
    with two_nodes.api() as api:
        x_token, x_ph = _oauth_claim(api, "sx", x_refresh, canary.make("starvexa"))
        y_token, y_ph = _oauth_claim(api, "sy", y_refresh, canary.make("starveya"))
    up.oauth_issued.append({"refresh_token": y_refresh})  # the fake endpoint also accepts Y's
    done: dict[str, float] = {}
    lock = threading.Lock()

    def x_refreshes(i: int) -> None:
        with two_nodes.client(0, "sx", x_token) as client:
            got = client.post(two_nodes.target("/oauth/token"), timeout=60,
                              data={"grant_type": "refresh_token", "refresh_token": x_ph})  # fmt: skip
        with lock:
            done.setdefault("x", time.monotonic())
            assert got.status_code == 200, got.text

    xs = [threading.Thread(target=x_refreshes, args=(i,)) for i in range(10)]
    for t in xs:
        t.start()
        time.sleep(0.05)
    time.sleep(1.5)  # X's holder is at the endpoint, its waiters wait
    with two_nodes.client(0, "sy", y_token) as client:
        y = client.post(two_nodes.target("/oauth/token"), timeout=60,
                        data={"grant_type": "refresh_token", "refresh_token": y_ph})  # fmt: skip
    y_done = time.monotonic()
    for t in xs:
        t.join()
    assert y.status_code == 200, y.text
    assert y_refresh in up.oauth_seen and up.oauth_seen.count(x_refresh) == 1
    assert y_done < done["x"], "claim Y's refresh waited behind claim X's"


def test_one_write_among_many_credentials_is_used_by_the_next_request_on_the_other_node(
    two_nodes: TwoNodes,
) -> None:
    """Issue 14 (a write re-reads what changed, applied to that credential only): with 40
    credentials in one claim, each write through the control API is in force on node B's next
    request: a patched value is sent, a deleted credential's placeholder is refused as forged
    before anything is sent, an added one is sent, an untouched one still is, and a budget spent
    before the writes is neither reset nor lost."""
    values = {f"k{n:02d}": canary.make(f"many{n}") for n in range(40)}
    patched, added = canary.make("manypatched"), canary.make("manyadded")
    ph: dict[str, str] = {}

    def get(path: str, name: str) -> httpx.Response:
        with two_nodes.client(1, "m", token) as client:  # a new connection: a delete closes tunnels
            return client.get(two_nodes.target(path), headers={"Authorization": f"Bearer {ph[name]}"})

    def sent(path: str) -> list[str]:
        return [dict((k.lower(), v) for k, v in r.headers)["authorization"]
                for r in two_nodes.upstream.requests if r.path == path]  # fmt: skip

    with two_nodes.api() as api:
        token = api.post("/v1/claims", json={"id": "m", "pool": "p"}).json()["proxy_token"]
        for name, value in values.items():
            body: dict[str, object] = {"hosts": ["api.test"], "value": value}
            if name == "k00":
                body["max_requests"] = 2
            r = api.put(f"/v1/claims/m/credentials/{name}", json=body)
            assert r.status_code == 201, r.text
            ph[name] = r.json()["placeholder"]
        assert get("/m/budget/1", "k00").status_code == 200
        assert api.patch("/v1/claims/m/credentials/k05", json={"value": patched}).status_code == 200
        assert get("/m/patched", "k05").status_code == 200 and sent("/m/patched") == [f"Bearer {patched}"]
        assert api.delete("/v1/claims/m/credentials/k07").status_code == 204
        refused = get("/m/deleted", "k07")
        assert (refused.status_code, refused.json()["error"]) == (403, "forged_placeholder")
        assert sent("/m/deleted") == []
        r = api.put("/v1/claims/m/credentials/new", json={"hosts": ["api.test"], "value": added})
        assert r.status_code == 201, r.text
        ph["new"] = r.json()["placeholder"]
        assert get("/m/added", "new").status_code == 200 and sent("/m/added") == [f"Bearer {added}"]
    assert get("/m/untouched", "k08").status_code == 200
    assert sent("/m/untouched") == [f"Bearer {values['k08']}"]
    assert [get(f"/m/budget/{n}", "k00").status_code for n in (2, 3)] == [200, 403]
    assert sent("/m/budget/3") == []
