"""End to end (issue 15): credentials of kind aws_sigv4, oauth_client and hmac created through
the control API only (the rules file declares no claim and no credential) work through a real
proxy process, on the SQLite store and on PostgreSQL (tests/pg.py).

The upstreams are those of test_sigv4.py (botocore's verifier with the REAL key), test_mint.py
and test_hmac.py (tests/e2e/_authserver.py: the real client secret, a rotating refresh token, the
real HMAC secret). A refresh token the endpoint rotates is sealed in the store, so a restarted
proxy mints with it (the first one is spent). Every response, the control API's answers, every
log, and the store file (SQLite; PostgreSQL's data files are scanned by tests/pg.py) are
scanned for the secrets: none is there.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import canary
import httpx
import pytest
from _authserver import AuthServer
from botocore.config import Config
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from harness import ProxyProcess
from sigv4_upstream import SigV4Upstream
from world import Stage, control, egress, rules

pytestmark = pytest.mark.e2e

AKID_PH = "surr_CtlAwsKeyIdPlaceholder001"
SECRET_PH = "surr_CtlAwsSecretPlaceholder01"
TOKEN_PH = "surr_CtlAwsTokenPlaceholder001"
HMAC_PH = "surr_CtlHmacPlaceholder0000001"
CC_PH = "surr_CtlMintCcPlaceholder00001"
RT_PH = "surr_CtlMintRtPlaceholder00001"
JWT_PH = "surr_CtlMintJwtPlaceholder0001"


@dataclass
class World:
    stage: Stage
    proxy: ProxyProcess
    token: str
    s3: SigV4Upstream
    auth: dict[str, AuthServer]
    written: list[dict[str, Any]]

    def keep(self, data: bytes) -> bytes:
        self.stage.received.append(data)
        return data

    @property
    def proxy_url(self) -> str:
        return self.proxy.url("c1", self.token)

    def client(self) -> httpx.Client:
        ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
        return httpx.Client(proxy=self.proxy_url, verify=ctx, timeout=30, trust_env=False)

    async def many(self, url: str, n: int) -> list[httpx.Response]:
        ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
        async with httpx.AsyncClient(proxy=self.proxy_url, verify=ctx, timeout=30, trust_env=False) as c:
            out = await asyncio.gather(*(c.get(url) for _ in range(n)))
        for r in out:
            self.keep(json.dumps(list(r.headers.multi_items())).encode() + r.content)
        return list(out)


def _put(api: httpx.Client, name: str, body: dict[str, Any]) -> dict[str, Any]:
    r = api.put(f"/v1/claims/c1/credentials/{name}", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"kinds-{request.param}")
    args: list[str] = []
    if request.param == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        args = ["--store", cluster.database(), "--key-file", str(tmp / "shared.key")]
    with Stage(tmp) as st:
        real = {
            "access_key_id": "AKIA" + canary.make("ctlakid")[6:22].upper(),
            "secret_access_key": canary.make("ctlawssecret"),
            "session_token": canary.make("ctlawstoken"),
        }
        cc_secret, rt_secret, rt_first = canary.make("ctlcc"), canary.make("ctlrt"), canary.make("ctlrefresh")
        hmac_secret = canary.make("ctlhmac")
        st.watch(*real.values(), cc_secret, rt_secret, rt_first, hmac_secret)
        s3 = st.serve(SigV4Upstream(st.ca, ["s3.test"], real["access_key_id"], real["secret_access_key"],
                                    real["session_token"]))  # fmt: skip
        auth = {
            "cc.test": st.serve(AuthServer(st.ca, ["cc.test"], "client-cc", cc_secret)),
            "rt.test": st.serve(AuthServer(st.ca, ["rt.test"], "client-rt", rt_secret)),
            "sig.test": st.serve(AuthServer(st.ca, ["sig.test"], "unused")),
            "jwt.test": st.serve(AuthServer(st.ca, ["jwt.test"], "client-jwt")),
        }
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()  # sent with its line breaks
        st.watch(pem.splitlines()[5])  # a line of the key: in no log, response or store file
        auth["jwt.test"].public_key = key.public_key()
        auth["jwt.test"].audience = f"https://jwt.test:{auth['jwt.test'].port}/token"
        auth["rt.test"].refresh = rt_first
        auth["sig.test"].hmac_secret = hmac_secret
        ports = {"s3.test": s3.port, **{n: a.port for n, a in auth.items()}}
        text = rules([egress(n, p) for n, p in ports.items()], claims=[])
        proxy = st.proxy(text, list(ports), control=True, args=args)
        if request.param == "sqlite":
            st.scanned += [proxy.state_dir / f"store.sqlite3{x}" for x in ("", "-wal", "-shm")]
        with control(proxy, timeout=30) as api:
            created = api.post("/v1/claims", json={"id": "c1", "pool": "p"})
            assert created.status_code == 201, created.text
            token = created.json()["proxy_token"]
            written = [
                _put(api, "aws", {"hosts": ["s3.test"], "kind": "aws_sigv4", "placeholder": AKID_PH,
                                  "aws_sigv4": {**real, "regions": ["us-east-1"], "services": ["s3"],
                                                "secret_placeholder": SECRET_PH,
                                                "session_token_placeholder": TOKEN_PH}}),
                _put(api, "cc", {"hosts": ["cc.test"], "kind": "oauth_client", "placeholder": CC_PH,
                                 "value": cc_secret,
                                 "mint": {"token_url": f"https://cc.test:{ports['cc.test']}/token",
                                          "client_id": "client-cc"}}),
                _put(api, "rt", {"hosts": ["rt.test"], "kind": "oauth_client", "placeholder": RT_PH,
                                 "value": rt_secret,
                                 "mint": {"token_url": f"https://rt.test:{ports['rt.test']}/token",
                                          "client_id": "client-rt", "grant": "refresh_token",
                                          "refresh_token": rt_first}}),
                _put(api, "jwt", {"hosts": ["jwt.test"], "kind": "oauth_client", "placeholder": JWT_PH,
                                  "value": pem,
                                  "mint": {"token_url": f"https://jwt.test:{ports['jwt.test']}/token",
                                           "client_id": "client-jwt", "grant": "jwt_bearer"}}),
                _put(api, "sig", {"hosts": ["sig.test"], "kind": "hmac", "placeholder": HMAC_PH,
                                  "value": hmac_secret, "sign": {"max_body": 4096}}),
            ]  # fmt: skip
            listed = api.get("/v1/claims/c1/credentials")
            st.received.append(listed.content)
            st.received += [json.dumps(w).encode() for w in written]
        yield World(st, proxy, token, s3, auth, written)
        for server in auth.values():
            st.watch(*server.handed, *([server.refresh] if server.refresh else []))


def test_the_control_api_answers_with_placeholders_and_never_a_secret(world: World) -> None:
    aws, cc, rt, _, sig = world.written
    assert aws["kind"] == "aws_sigv4" and aws["aws_sigv4"]["secret_placeholder"] == SECRET_PH
    assert cc["kind"] == rt["kind"] == "oauth_client" and rt["mint"]["grant"] == "refresh_token"
    assert sig["kind"] == "hmac" and sig["sign"]["max_body"] == 4096
    assert "refresh_token" not in rt["mint"] and "secret_access_key" not in aws["aws_sigv4"]


def test_aws_sigv4_put_get_and_a_streaming_upload(world: World) -> None:
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=f"https://s3.test:{world.s3.port}", region_name="us-east-1",
        aws_access_key_id=AKID_PH, aws_secret_access_key=SECRET_PH, aws_session_token=TOKEN_PH,
        verify=str(world.proxy.ca_pem),
        config=Config(proxies={"https": world.proxy_url}, s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}),
    )  # fmt: skip
    s3.put_object(Bucket="b", Key="small.txt", Body=b"hello from the control api")
    got = s3.get_object(Bucket="b", Key="small.txt")
    assert world.keep(got["Body"].read()) == b"hello from the control api"
    data = os.urandom(6 * 1024 * 1024)  # boto3's default: aws-chunked, chunk signatures re-signed
    s3.put_object(Bucket="b", Key="big.bin", Body=data)
    assert world.s3.objects["/b/big.bin"] == data
    assert not world.s3.refused


def test_oauth_client_concurrent_requests_mint_one_token(world: World) -> None:
    url = f"https://cc.test:{world.auth['cc.test'].port}/api"
    assert [r.status_code for r in asyncio.run(world.many(url, 20))] == [200] * 20
    assert world.auth["cc.test"].token_requests == 1
    assert world.auth["cc.test"].grants == ["client_credentials"]


def test_jwt_bearer_signs_with_a_pem_key_put_with_its_line_breaks(world: World) -> None:
    server = world.auth["jwt.test"]
    rs = asyncio.run(world.many(f"https://jwt.test:{server.port}/api", 3))
    assert [r.status_code for r in rs] == [200] * 3, rs[0].text
    assert server.token_requests == 1 and server.grants == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]


def test_a_rotated_refresh_token_is_used_after_a_restart(world: World) -> None:
    """Regression (issue 15): the rotated refresh token lived in the proxy's memory only; after a
    restart it minted with the first one, which the endpoint had spent (400 invalid_grant)."""
    server = world.auth["rt.test"]
    url = f"https://rt.test:{server.port}/api"
    assert asyncio.run(world.many(url, 1))[0].status_code == 200
    assert server.token_requests == 1
    world.proxy.stop()
    world.proxy.start()
    rs = asyncio.run(world.many(url, 1))
    assert rs[0].status_code == 200, rs[0].text
    assert server.token_requests == 2 and server.grants == ["refresh_token", "refresh_token"]


@pytest.mark.parametrize(("method", "path", "body"), [("GET", "/hmac/orders?limit=5", None),
                                                        ("POST", "/hmac/orders", b'{"size":"1"}')],
                         ids=["get", "post"])  # fmt: skip
def test_hmac_signed_with_the_stored_secret(world: World, method: str, path: str, body: bytes | None) -> None:
    with world.client() as c:
        url = f"https://sig.test:{world.auth['sig.test'].port}{path}"
        r = c.request(method, url, content=body, headers={"X-Signature": HMAC_PH})
    world.keep(json.dumps(list(r.headers.multi_items())).encode() + r.content)
    assert r.status_code == 200, r.text


def test_the_audit_names_the_kind_and_what_was_applied(world: World) -> None:
    applied = {
        c["name"]: c.get("applied")
        for e in world.proxy.audit_events()
        if e.get("event") == "request"
        for c in e.get("credentials", [])
    }
    kinds = {
        c["name"]: (c.get("kind"), c.get("signature"))
        for e in world.proxy.audit_events()
        if e.get("event") == "request"
        for c in e.get("credentials", [])
    }
    assert kinds["aws"] == ("aws_sigv4", "sigv4")  # hmac and oauth_client say it in "applied"
    assert applied.get("sig") == "hmac_signed"
    assert applied.get("cc") in ("token_minted", "token_cached")


def test_two_workers_mint_with_one_rotating_refresh_token(tmp_path: Path) -> None:
    """Regression (issue 15, fleet): each worker minted with the refresh token it read, so two
    workers minting at once both presented the same one and the endpoint refused the second
    (400 invalid_grant: a refresh token is spent by its use). Under the store's lease the second
    waits, reads the rotated one from the store and mints with it."""
    with Stage(tmp_path) as st:
        secret, first = canary.make("ctlrt2"), canary.make("ctlrefresh2")
        st.watch(secret, first)
        server = st.serve(AuthServer(st.ca, ["rt.test"], "client-rt", secret))
        server.refresh, server.delay = first, 1.0  # a slow endpoint: the two workers' mints overlap
        text = rules([egress("rt.test", server.port)], claims=[])
        proxy = st.proxy(text, ["rt.test"], control=True, workers=2)
        st.scanned += [proxy.state_dir / f"store.sqlite3{x}" for x in ("", "-wal", "-shm")]
        with control(proxy, timeout=30) as api:
            token = api.post("/v1/claims", json={"id": "c1", "pool": "p"}).json()["proxy_token"]
            st.received.append(api.put("/v1/claims/c1/credentials/rt", json={
                "hosts": ["rt.test"], "kind": "oauth_client", "value": secret, "placeholder": RT_PH,
                "mint": {"token_url": f"https://rt.test:{server.port}/token", "client_id": "client-rt",
                         "grant": "refresh_token", "refresh_token": first}}).content)  # fmt: skip

        async def one() -> httpx.Response:  # its own connection: the workers share the listener
            ctx = ssl.create_default_context(cafile=str(proxy.ca_pem))
            async with httpx.AsyncClient(proxy=proxy.url("c1", token), verify=ctx, timeout=60) as c:
                return await c.get(f"https://rt.test:{server.port}/api")

        async def many() -> list[httpx.Response]:
            return list(await asyncio.gather(*(one() for _ in range(12))))

        rs = asyncio.run(many())
        st.received += [r.content for r in rs]
        assert [r.status_code for r in rs] == [200] * 12, [r.text[:200] for r in rs if r.status_code != 200]
        assert "invalid_grant" not in json.dumps([r.text for r in rs])
        st.watch(*server.handed, server.refresh)


def test_the_cli_puts_a_kind_from_its_block_file(world: World, tmp_path: Path) -> None:
    """``surrogate creds put --kind hmac --kind-file``: the value from stdin, the block from a file."""
    import subprocess
    import sys

    from harness import ROOT

    secret = world.auth["sig.test"].hmac_secret  # the upstream verifies with this one secret
    (tmp_path / "sign.json").write_text(json.dumps({"max_body": 1024}))
    placeholder = "surr_CtlHmacCliPlaceholder0001"
    argv = [sys.executable, "-m", "proxy", "creds", "put", "c1", "sig-cli", "--host", "sig.test",
            "--placeholder", placeholder, "--kind", "hmac", "--kind-file", str(tmp_path / "sign.json"),
            "--value-file", "-", "--state-dir", str(world.proxy.state_dir)]  # fmt: skip
    out = subprocess.run(argv, input=secret + "\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    world.keep((out.stdout + out.stderr).encode())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["sign"]["max_body"] == 1024
    with world.client() as c:
        r = c.get(
            f"https://sig.test:{world.auth['sig.test'].port}/hmac/cli", headers={"X-Signature": placeholder}
        )
    world.keep(r.content)
    assert r.status_code == 200, r.text
