"""Control-API measurements: a write used by the very next request, writes per second, and
registering many credentials on one claim (for the placeholder-count comparison under load).
"""

from __future__ import annotations

import ssl
import statistics
import time
from dataclasses import dataclass

import httpx
from proxies import UPSTREAM_HOST, Surrogate
from servers import Upstream


@dataclass(frozen=True, slots=True)
class WriteThenRequest:
    carried: int  # how many of the next requests carried the value just written
    rounds: int
    median_ms: float
    max_ms: float
    writes_per_s: float


def write_then_request(proxy: Surrogate, upstream: Upstream, rounds: int) -> WriteThenRequest:
    """PATCH a value, then send the next request on an already-open tunnel: did it carry it?

    The upstream is tests/servers.Upstream, which records the headers it received (nginx does
    not, and a response cannot show them: surrogate scrubs secrets out of responses).
    """
    api = proxy.api()
    token = api.post("/v1/claims", json={"id": "bench", "pool": "p"}).json()["proxy_token"]
    body = {"hosts": [UPSTREAM_HOST], "value": "v0"}
    ph = api.put("/v1/claims/bench/credentials/k", json=body).json()["placeholder"]
    ctx = ssl.create_default_context(cafile=str(proxy.process.ca_pem))
    client = httpx.Client(proxy=proxy.process.url("bench", token), verify=ctx)
    base = f"https://{UPSTREAM_HOST}:{upstream.port}"
    client.get(f"{base}/{proxy.name}/warm", headers={"X-Api-Key": ph})
    seen, lat = 0, []
    for i in range(1, rounds + 1):
        t0 = time.perf_counter()
        api.patch("/v1/claims/bench/credentials/k", json={"value": f"value{i}"}).raise_for_status()
        client.get(f"{base}/{proxy.name}/{i}", headers={"X-Api-Key": ph})
        lat.append((time.perf_counter() - t0) * 1000)
        path = f"/{proxy.name}/{i}"
        sent = [v for r in upstream.requests if r.path == path for k, v in r.headers if k == "X-Api-Key"]
        seen += sent == [f"value{i}"]
    t0, writes = time.perf_counter(), 0
    while time.perf_counter() - t0 < 2.0:
        api.patch("/v1/claims/bench/credentials/k", json={"value": f"w{writes}"}).raise_for_status()
        writes += 1
    rate = writes / (time.perf_counter() - t0)
    client.close()
    api.close()
    return WriteThenRequest(seen, rounds, statistics.median(lat), max(lat), rate)


@dataclass(frozen=True, slots=True)
class Registered:
    claim: str
    token: str
    placeholder: str  # of the credential the load sends
    seconds: float  # to register them all
    first_per_s: float  # PUT rate over the first tenth of them
    last_per_s: float  # and over the last tenth (does a write cost more as the claim grows?)


def register_claim(proxy: Surrogate, claim: str, credentials: int) -> Registered:
    """Create ``claim`` through the control API and PUT ``credentials`` credentials on it."""
    with proxy.api() as api:
        r = api.post("/v1/claims", json={"id": claim, "pool": "p"})
        r.raise_for_status()
        token = r.json()["proxy_token"]
        t0 = time.perf_counter()
        placeholder, stamps = "", []
        for i in range(credentials):
            stamps.append(time.perf_counter())
            r = api.put(
                f"/v1/claims/{claim}/credentials/k{i}",
                json={"hosts": [UPSTREAM_HOST], "value": f"BulkSecret{i:05d}"},
            )
            r.raise_for_status()
            placeholder = r.json()["placeholder"]
        stamps.append(time.perf_counter())
        tenth = max(1, credentials // 10)
        first = tenth / (stamps[tenth] - stamps[0])
        last = tenth / (stamps[-1] - stamps[-1 - tenth])
        return Registered(claim, token, placeholder, stamps[-1] - t0, first, last)
