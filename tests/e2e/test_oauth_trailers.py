"""A token endpoint speaking HTTP/2 that puts a fresh real token in its trailers (RFC 9113
§8.1), after a body capture has read: the trailers come after the ``responseheaders`` check of
the head, so they were passed to an HTTP/2 sandbox whole (issue 19's attack session,
2026-12-04). Now the trailers of a token endpoint's answer are checked as its head is (a
token-like name, a value showing a token-like ``name=value``, percent-encoded too) and such an
answer is refused: the stream is reset, audited ``unscannable_response``, and nothing the
endpoint issued reaches the sandbox. Plain trailers (a checksum) still pass."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import canary
import pytest
from harness import ProxyProcess
from hypercorn_server import HypercornServer
from servers import TestCA
from world import Stage, control, egress, rules

pytestmark = pytest.mark.e2e

# the trailers each shape sends after a 200 whose body carries a fresh access token
SHAPES: dict[str, Any] = {
    "token-like-name": lambda t: [(b"x-refresh-token", t["refresh_token"])],
    "name-value": lambda t: [(b"x-grant", b"refresh_token=" + t["refresh_token"])],
    "percent-encoded": lambda t: [(b"x-grant", b"refresh%5Ftoken=" + t["refresh_token"])],
    "json-in-value": lambda t: [(b"x-debug", b'{"id_token": "' + t["id_token"] + b'"}')],
}


class H2TokenEndpoint(HypercornServer):
    """HTTP/2 ``POST /oauth/token``: a 200 JSON token response, then the trailers ``self.shape``
    gives for the tokens it just issued (each a new canary, in ``self.issued``)."""

    def __init__(self, ca: TestCA, tmp: Path) -> None:
        cert = ca.ca.issue_cert("api.test")
        cert_pem, key_pem = tmp / "h2tok-cert.pem", tmp / "h2tok-key.pem"
        cert.cert_chain_pems[0].write_to_path(str(cert_pem))
        cert.private_key_pem.write_to_path(str(key_pem))
        super().__init__(cert_pem, key_pem, ["h2"], "h2token")
        self.shape: Any = None
        self.issued: list[dict[str, bytes]] = []

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        tokens = {f: canary.make("h2tok").encode() for f in ("access_token", "refresh_token", "id_token")}
        self.issued.append(tokens)
        body = json.dumps({"token_type": "Bearer", "access_token": tokens["access_token"].decode()})
        head = [(b"content-type", b"application/json"), (b"trailer", b"x-grant")]
        await send({"type": "http.response.start", "status": 200, "headers": head, "trailers": True})
        await send({"type": "http.response.body", "body": body.encode()})
        await send({"type": "http.response.trailers", "headers": self.shape(tokens)})


@dataclass
class World:
    proxy: ProxyProcess
    up: H2TokenEndpoint
    canaries: list[str]

    def attack(self, claim: str, shape: Any) -> tuple[subprocess.CompletedProcess[bytes], dict[str, bytes]]:
        """Run one refresh through the proxy over HTTP/2; what curl got, and what was issued."""
        refresh = canary.make("h2ref")
        self.canaries.append(refresh)
        spec = {"token_endpoint": {"host": "api.test", "path": "/oauth/token"}, "access_token": "access"}
        with control(self.proxy) as api:
            token = api.post("/v1/claims", json={"id": claim, "pool": "p"}).json()["proxy_token"]
            for name, extra in (("access", {}), ("refresh", {"surfaces": ["body"], "oauth": spec})):
                value = refresh if name == "refresh" else canary.make("h2acc")
                self.canaries.append(value)
                r = api.put(
                    f"/v1/claims/{claim}/credentials/{name}",
                    json={"hosts": ["api.test"], "value": value, **extra},
                )
                assert r.status_code == 201, r.text
            placeholder = r.json()["placeholder"]
        self.up.shape = shape
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "15", "--http2", "-H", "TE: trailers", "-D", "-",
             "-x", self.proxy.url(claim, token), "--cacert", str(self.proxy.ca_pem),
             "-d", f"grant_type=refresh_token&refresh_token={placeholder}",
             f"https://api.test:{self.up.port}/oauth/token"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        issued = self.up.issued[-1]
        self.canaries += [v.decode() for v in issued.values()]  # the stage's scan seeks them too
        return done, issued


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("oauth-h2")) as st:
        up = st.serve(H2TokenEndpoint(st.ca, st.tmp))
        proxy = st.proxy(rules([egress("api.test", up.port)], claims=[]), ["api.test"], control=True)
        st.scanned += [proxy.state_dir / f"store.sqlite3{x}" for x in ("", "-wal", "-shm")]
        yield World(proxy, up, st.canaries)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_token_in_a_token_endpoints_http2_trailers_never_reaches_the_sandbox(
    world: World, shape: str
) -> None:
    done, issued = world.attack(f"h2t-{shape}", SHAPES[shape])
    got = done.stdout + done.stderr
    assert not [k for k, v in issued.items() if v in got], got[:600]
    event = world.proxy.wait_event(claim=f"h2t-{shape}", path="/oauth/token")
    assert event["reason"] == "unscannable_response", event


def test_plain_trailers_of_a_token_endpoint_still_pass(world: World) -> None:
    done, issued = world.attack("h2t-plain", lambda t: [(b"x-checksum", b"sha256-abc")])
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "x-checksum: sha256-abc" in out, out
    assert issued["access_token"].decode() not in out and '"access_token": "surr_' in out, out
