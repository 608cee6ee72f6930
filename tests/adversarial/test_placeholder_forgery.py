"""Placeholder forgery and credential budgets against a hostile sandbox: real bytes at a running
proxy over loopback.

A placeholder that carries surrogate's checksum but is not the sending claim's (another claim's,
a deleted one, a forged one) is refused as ``forged_placeholder`` before any upstream connection,
and audited with where it was found; a string that merely looks like a placeholder passes inert.
A credential whose request budget is spent is refused (``credential_budget_spent``), from the
rules file and from the control API."""

from __future__ import annotations

import base64
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

from proxy.core import placeholders

pytestmark = pytest.mark.e2e

MINE = placeholders.generate()
OTHERS = placeholders.generate()
BUDGETED = placeholders.generate()
BODY_BUDGETED = placeholders.generate()


@dataclass
class World:
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str
    received: list[bytes]

    def url(self, path: str) -> str:
        return f"https://api.test:{self.upstream.port}{path}"

    def curl(self, claim: str, *args: str) -> tuple[int, bytes]:
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-x", self.proxy.url(claim, self.token)]
            + ["--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", *args],
            capture_output=True,
            timeout=30,
            check=False,
        )
        self.received.append(done.stdout + done.stderr)
        body, _, code = done.stdout.rpartition(b"\n")
        return int(code), body

    def api(self) -> httpx.Client:
        return control(self.proxy, timeout=10)

    def seen(self, path: str) -> list[list[tuple[str, str]]]:
        """The header fields (names lower-cased) of each request the upstream got at ``path``."""
        return [[(n.lower(), v) for n, v in r.headers] for r in self.upstream.requests if r.path == path]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("forgery")) as st:
        secret = st.secret("api", tag="forgery", file="secret")
        token = st.token(secrets.token_urlsafe(16), newline=False)
        upstream = st.upstream(["api.test"])
        api, value = ["api.test"], "file:secret"
        text = rules(
            [egress("api.test", upstream.port)],
            claims=[
                claim(
                    "a",
                    [
                        credential("api", MINE, api, value),
                        credential("metered", BUDGETED, api, value, max_requests=2),
                        credential(
                            "metered-body", BODY_BUDGETED, api, value, surfaces=["body"], max_requests=1
                        ),
                    ],
                ),
                claim("b", [credential("api", OTHERS, api, value)]),
            ],
        )
        yield World(upstream, st.proxy(text, ["api.test"]), token, secret, st.received)


def test_own_placeholder_is_swapped(world: World) -> None:
    status, _ = world.curl("a", "-H", f"Authorization: Bearer {MINE}", world.url("/mine"))
    assert status == 200
    assert ("authorization", f"Bearer {world.secret}") in world.seen("/mine")[0]


@pytest.mark.parametrize(
    ("args", "place"),
    [
        (["-H", f"Authorization: Bearer {OTHERS}"], "header Authorization"),
        (["-H", f"X-Api-Key: {OTHERS}"], "header X-Api-Key"),
        (["-u", f"x:{OTHERS}"], "header Authorization"),
        (["--url-query", f"key={OTHERS}"], "request target"),
        # issue 13 class 5: the spellings the violation scan reads
        (["--http1.1", "-H", f"{OTHERS}: 1"], "a header name"),
        (["-H", f"X-Trace: {base64.b64encode(b'k:' + OTHERS.encode()).decode()}"], "header X-Trace"),
        (["-H", f"Cookie: s={OTHERS.replace('_', '%5F')}"], "header Cookie"),
    ],
    ids=["bearer", "api-key-header", "basic", "query", "header-name", "base64-header", "percent-cookie"],
)
def test_another_claims_placeholder_is_refused_as_forged_before_connecting(
    world: World, args: list[str], place: str
) -> None:
    path = f"/forged-{place.replace(' ', '-')}-{len(args[1])}-{args[0]}"
    before = world.upstream.connections
    status, body = world.curl("a", *args, world.url(path))
    assert status == 403 and b"forged_placeholder" in body
    assert OTHERS.encode() not in body
    assert world.upstream.connections == before and world.seen(path) == []
    (event,) = [e for e in world.proxy.audit_events() if e["path"].split("?")[0] == path]
    assert (event["decision"], event["reason"]) == ("violation", "forged_placeholder")
    assert [p.lower() for p in event["forged"]] == [place.lower()]  # curl speaks HTTP/2: lower case
    assert OTHERS not in world.proxy.audit_path.read_text()


def test_a_forged_checksum_is_refused_and_a_lookalike_passes_inert(world: World) -> None:
    stem = "surr_" + "Forged" * 4
    forged = stem + placeholders.checksum(stem)
    status, body = world.curl("a", "-H", f"X-Token: {forged}", world.url("/forged-made-up"))
    assert status == 403 and b"forged_placeholder" in body
    lookalike = "surr_" + "LooksLikeOne" * 2
    status, _ = world.curl("a", "-H", f"X-Token: {lookalike}", world.url("/lookalike"))
    assert status == 200
    assert ("x-token", lookalike) in world.seen("/lookalike")[0]
    assert world.proxy.wait_event(path="/lookalike")["forged"] == []


def test_a_deleted_credentials_placeholder_is_forged(world: World) -> None:
    with world.api() as api:
        assert api.post("/v1/claims", json={"id": "rt", "pool": "p"}).status_code == 201
        created = api.put("/v1/claims/rt/credentials/k", json={"hosts": ["api.test"], "value": world.secret})
        assert created.status_code in (200, 201), created.text
        ph = created.json()["placeholder"]
        assert placeholders.has_valid_checksum(ph)
        assert api.delete("/v1/claims/rt/credentials/k").status_code == 204
    # the deleted placeholder, sent by claim a, is refused like another claim's
    status, body = world.curl("a", "-H", f"Authorization: Bearer {ph}", world.url("/deleted"))
    assert status == 403 and b"forged_placeholder" in body
    assert world.seen("/deleted") == []


def test_a_spent_budget_refuses_the_credential(world: World) -> None:
    codes = [
        world.curl("a", "-H", f"Authorization: Bearer {BUDGETED}", world.url(f"/metered/{i}"))[0]
        for i in range(3)
    ]
    assert codes == [200, 200, 403]
    assert world.seen("/metered/2") == []
    event = world.proxy.wait_event(path="/metered/2")
    assert event["reason"] == "credential_budget_spent" and event["credentials"] == []
    # another credential of the same claim is not affected
    assert world.curl("a", "-H", f"Authorization: Bearer {MINE}", world.url("/after-budget"))[0] == 200


def test_a_budget_counts_swaps_in_a_request_body(world: World) -> None:
    """Regression: a credential swapped only in a request body was never counted."""
    data = f"token={BODY_BUDGETED}"
    first = world.curl("a", "--data-binary", data, world.url("/body-metered/0"))
    assert first[0] == 200
    (got,) = [r for r in world.upstream.requests if r.path == "/body-metered/0"]
    assert got.body_len == len(f"token={world.secret}")
    status, _ = world.curl("a", "--data-binary", data, world.url("/body-metered/1"))
    assert status != 200  # the head had left: the connection is closed before the secret
    assert [r for r in world.upstream.requests if r.path == "/body-metered/1"] == []
    event = world.proxy.wait_event(path="/body-metered/1")
    assert event["reason"] == "credential_budget_spent" and event["violation_surface"] == "body"


def test_a_control_api_budget_is_kept_in_the_store(world: World) -> None:
    with world.api() as api:
        made = api.post("/v1/claims", json={"id": "metered", "pool": "p"})
        assert made.status_code == 201
        proxy_token = made.json()["proxy_token"]
        put = api.put(
            "/v1/claims/metered/credentials/k",
            json={"hosts": ["api.test"], "value": world.secret, "max_requests": 1},
        )
        assert put.status_code in (200, 201), put.text
        ph = put.json()["placeholder"]
        assert put.json()["max_requests"] == 1
    time.sleep(0.3)
    url = world.proxy.url("metered", proxy_token)
    codes = []
    for i in range(2):
        done = subprocess.run(
            ["curl", "-sS", "-x", url, "--cacert", str(world.proxy.ca_pem), "-w", "\n%{http_code}"]
            + ["-H", f"Authorization: Bearer {ph}", world.url(f"/store-metered/{i}")],
            capture_output=True,
            timeout=30,
            check=False,
        )
        world.received.append(done.stdout + done.stderr)
        codes.append(int(done.stdout.rsplit(b"\n", 1)[-1]))
    assert codes == [200, 403]
    with world.api() as api:
        got = api.get("/v1/claims/metered/credentials/k").json()
    assert (got["max_requests"], got["requests_used"]) == (1, 1)


def test_the_cli_client_sets_a_budget_and_a_bad_one_is_a_clear_error(world: World) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "proxy", *args, "--state-dir", str(world.proxy.state_dir)],
            input=world.secret,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    assert run("claims", "create", "--pool", "p", "--id", "cli-budget").returncode == 0
    put = ["creds", "put", "cli-budget", "k", "--host", "api.test", "--value-file", "-"]
    ok = run(*put, "--max-requests", "3")
    assert ok.returncode == 0 and '"max_requests": 3' in ok.stdout, ok.stderr
    bad = run(*put, "--max-requests", "0")
    assert bad.returncode == 1 and "max_requests" in bad.stderr and world.secret not in bad.stderr
