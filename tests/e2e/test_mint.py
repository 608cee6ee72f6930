"""End to end: credentials of kind ``oauth_client`` (issue 15, token minting). A real proxy
process, real loopback authorization servers (tests/e2e/_authserver.py, HTTPS under the test CA)
that count token requests and check the client's authentication with the real secret (or the
JWT with the public key), and httpx as the sandbox, holding only its proxy token.

50 concurrent requests → one token request; expiry → one refresh; client_credentials,
refresh_token (the rotated refresh token is used next) and jwt_bearer; a failing token endpoint
→ ``token_mint_failed`` without its body; the sandbox never sees the client secret, the refresh
token or any access token (the stage's canary scan of everything received and every log).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import canary
import httpx
import pytest
from _authserver import AuthServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from harness import ProxyProcess
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

NAMES = ["cc.test", "exp.test", "rt.test", "jwt.test", "fail.test", "pkj.test"]
PH = {n: f"surr_Mint{n.split('.')[0].capitalize()}Placeholder0000001" for n in NAMES}


@dataclass
class World:
    proxy: ProxyProcess
    token: str
    auth: dict[str, AuthServer]
    received: list[bytes] = field(default_factory=list)

    async def get(self, host: str, n: int = 1, path: str = "/api") -> list[httpx.Response]:
        url = f"https://{host}:{self.auth[host].port}{path}"
        async with httpx.AsyncClient(
            proxy=self.proxy.url("c1", self.token),
            verify=ssl.create_default_context(cafile=str(self.proxy.ca_pem)),
            timeout=30,
        ) as client:
            out = await asyncio.gather(*(client.get(url) for _ in range(n)))
        for r in out:
            self.received.append(json.dumps(list(r.headers.multi_items())).encode() + r.content)
        return list(out)


def _mint(host: str, port: int, **extra: object) -> dict[str, object]:
    return {"token_url": f"https://{host}:{port}/token", "client_id": f"client-{host}", **extra}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("mint")) as st:
        token = st.token()
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        (st.tmp / "secret-jwt").write_text(pem.strip().replace("\n", "\\n") + "\n")
        auth: dict[str, AuthServer] = {}
        for name in NAMES:
            secret = st.secret(name.split(".")[0]) if name not in ("jwt.test", "pkj.test") else ""
            server = AuthServer(st.ca, [name], f"client-{name}", secret)
            auth[name] = st.serve(server)
        for name in ("jwt.test", "pkj.test"):
            auth[name].public_key = key.public_key()
            auth[name].audience = f"https://{name}:{auth[name].port}/token"
        (st.tmp / "secret-pkj").write_text((st.tmp / "secret-jwt").read_text())
        # not pinned: "localhost" resolves to loopback, which the pool does not allow
        local = st.serve(AuthServer(st.ca, ["localhost"], "client-localhost", st.secret("local")))
        auth["localhost"] = local
        auth["exp.test"].expires_in = 33  # margin 30: fresh for 3 seconds
        refresh = st.secret("rtrefresh")
        auth["rt.test"].refresh = refresh
        leak = canary.make("mintleak")
        st.watch(leak)
        auth["fail.test"].fail = (400, {"error": "invalid_client", "error_description": leak})
        creds = [
            credential("cc", PH["cc.test"], ["cc.test"], kind="oauth_client",
                       mint=_mint("cc.test", auth["cc.test"].port)),
            credential("exp", PH["exp.test"], ["exp.test"], kind="oauth_client",
                       mint=_mint("exp.test", auth["exp.test"].port, client_auth="secret_post")),
            credential("rt", PH["rt.test"], ["rt.test"], kind="oauth_client",
                       mint=_mint("rt.test", auth["rt.test"].port, grant="refresh_token",
                                  refresh_token="file:secret-rtrefresh")),
            credential("jwt", PH["jwt.test"], ["jwt.test"], kind="oauth_client",
                       mint=_mint("jwt.test", auth["jwt.test"].port, grant="jwt_bearer")),
            credential("fail", PH["fail.test"], ["fail.test"], kind="oauth_client",
                       mint=_mint("fail.test", auth["fail.test"].port)),
            credential("pkj", PH["pkj.test"], ["pkj.test"], kind="oauth_client",
                       mint=_mint("pkj.test", auth["pkj.test"].port, client_auth="private_key_jwt")),
            credential("local", "surr_MintLocalhostPlaceholder001", ["localhost"], kind="oauth_client",
                       mint=_mint("localhost", local.port)),
        ]  # fmt: skip
        text = rules([egress(n, auth[n].port) for n in [*NAMES, "localhost"]], credentials=creds)
        w = World(st.proxy(text, NAMES), token, auth, st.received)
        yield w
        for server in auth.values():
            st.watch(*server.handed, *([server.refresh] if server.refresh else []))  # never seen


def test_fifty_concurrent_requests_cause_one_token_request(world: World) -> None:
    responses = asyncio.run(world.get("cc.test", 50))
    assert [r.status_code for r in responses] == [200] * 50
    assert world.auth["cc.test"].token_requests == 1
    assert world.auth["cc.test"].grants == ["client_credentials"]
    assert len(set(world.auth["cc.test"].api_auth)) == 1  # all 50 carried the one token
    applied = [c.get("applied") for e in _audit(world) for c in e.get("credentials", []) if c["name"] == "cc"]
    assert sorted(applied) == ["token_cached"] * 49 + ["token_minted"]
    entries = [c for e in _audit(world) for c in e.get("credentials", []) if c["name"] == "cc"]
    kinds = {(c.get("kind"), c.get("grant")) for c in entries}
    assert kinds == {("oauth_client", "client_credentials")}  # the kind and grant of every entry (issue 15)


def _audit(world: World) -> list[dict[str, object]]:
    lines = world.proxy.audit_path.read_text().splitlines()
    return [e for e in map(json.loads, filter(str.strip, lines)) if e.get("event") == "request"]


def test_an_expiring_token_is_refreshed_once(world: World) -> None:
    server = world.auth["exp.test"]
    assert [r.status_code for r in asyncio.run(world.get("exp.test", 5))] == [200] * 5
    assert server.token_requests == 1
    time.sleep(3.5)  # past expires_in - margin
    assert [r.status_code for r in asyncio.run(world.get("exp.test", 20))] == [200] * 20
    assert server.token_requests == 2
    assert len(set(server.api_auth)) == 2


def test_refresh_token_grant_uses_the_rotated_refresh_token(world: World) -> None:
    server = world.auth["rt.test"]
    assert asyncio.run(world.get("rt.test"))[0].status_code == 200
    first = server.refresh
    server.issued.clear()  # the API now refuses the token: the proxy drops it on the 401
    assert asyncio.run(world.get("rt.test"))[0].status_code == 401
    assert asyncio.run(world.get("rt.test"))[0].status_code == 200  # minted anew with the rotated one
    assert server.token_requests == 2 and server.refresh != first
    assert server.grants == ["refresh_token", "refresh_token"]


def test_jwt_bearer_assertion_is_verified_with_the_public_key(world: World) -> None:
    assert asyncio.run(world.get("jwt.test", 3))[0].status_code == 200
    assert world.auth["jwt.test"].token_requests == 1
    assert world.auth["jwt.test"].grants == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]


def test_a_failing_token_endpoint_gives_the_reason_and_never_its_body(world: World) -> None:
    (r,) = asyncio.run(world.get("fail.test"))
    assert r.status_code == 502
    body = r.json()
    assert body["error"] == "token_mint_failed"
    assert "http_400:invalid_client" in body["message"]
    assert world.auth["fail.test"].api_auth == []  # nothing was sent to the API
    assert "invalid_client" in r.headers["proxy-status"] or "token_mint_failed" in r.headers["proxy-status"]
    audit = [json.loads(x) for x in world.proxy.audit_path.read_text().splitlines() if x.strip()]
    assert any(e.get("reason") == "token_mint_failed" for e in audit)


def test_client_credentials_with_a_private_key_jwt_client_assertion(world: World) -> None:
    assert asyncio.run(world.get("pkj.test", 3))[0].status_code == 200
    assert world.auth["pkj.test"].token_requests == 1
    assert world.auth["pkj.test"].grants == ["client_credentials"]


def test_the_token_request_takes_the_address_checks_of_any_upstream_request(world: World) -> None:
    """The token endpoint's name resolves to loopback (not pinned, not in allow_cidrs): refused
    before any token request, like a request of the sandbox to that address would be."""
    (r,) = asyncio.run(world.get("localhost"))
    assert r.status_code == 503 and r.json()["error"] == "token_mint_failed"
    assert world.auth["localhost"].token_requests == 0
