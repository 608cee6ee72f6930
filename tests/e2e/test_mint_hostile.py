"""End to end: a hostile token endpoint and a hostile API against credentials of kind
``oauth_client`` (issue 15, token minting; review r-sign2). A real proxy process, real loopback
TLS servers under the test CA that answer as scripted, httpx as the sandbox.

- a token endpoint whose OAuth ``error`` is the client secret it was sent: the refusal and the
  log name the status and ``unregistered``, never the value;
- a token endpoint that drips its answer (one byte at a time, each well inside the read timeout):
  the mint gives up after its total deadline, so the waiters are not held for as long as the
  endpoint likes;
- a redirect from the token endpoint is not followed (the secret goes to no other place);
- a huge answer is refused without being read whole;
- an API that echoes the minted token (body, header, base64) hands the sandbox the placeholder.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import canary
import httpx
import pytest
from _authserver import AuthServer
from harness import ProxyProcess
from servers import TestCA
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

Script = Callable[[BaseHTTPRequestHandler], None]


class ScriptServer:
    """A TLS HTTP/1.1 server on loopback answering every request with ``script(handler)``."""

    def __init__(self, ca: TestCA, names: list[str], script: Script) -> None:
        self.requests = 0
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                outer.requests += 1
                outer.paths.append(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                with contextlib.suppress(OSError):  # the proxy gave up on us: what the drip test wants
                    script(self)

            do_GET = do_POST = _any

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*names).configure_cert(ctx)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]

    def start(self) -> ScriptServer:
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    h.send_response(status)
    for k, v in {"Content-Type": "application/json", **headers}.items():
        h.send_header(k.replace("_", "-"), v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


DRIP_SECONDS = 40.0  # the drip lasts longer than the mint's deadline and the client's wait


def _drip(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", "60000")
    h.end_headers()
    h.wfile.flush()
    end = time.monotonic() + DRIP_SECONDS
    while time.monotonic() < end:
        h.wfile.write(b" ")
        h.wfile.flush()
        time.sleep(0.5)


def _huge(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(50 * 1024 * 1024))
    h.end_headers()
    chunk = b" " * 65536
    for _ in range(800):
        h.wfile.write(chunk)


NAMES = ["echoerr.test", "drip.test", "redir.test", "other.test", "huge.test", "echoapi.test", "fail50.test"]


@dataclass
class World:
    stage: Stage
    proxy: ProxyProcess
    token: str
    servers: dict[str, Any]
    secrets: dict[str, str]
    minted: str  # the token echoapi.test's endpoint hands out (a canary)

    def get(self, host: str, timeout: float = 30) -> httpx.Response:
        url = f"https://{host}:{self.servers[host].port}/api"
        with httpx.Client(
            proxy=self.proxy.url("c1", self.token),
            verify=ssl.create_default_context(cafile=str(self.proxy.ca_pem)),
            timeout=timeout,
        ) as client:
            r = client.get(url)
        self.stage.received.append(json.dumps(list(r.headers.multi_items())).encode() + r.content)
        return r


def _ph(name: str) -> str:
    return f"surr_Hostile{name.split('.')[0].capitalize()}Placeholder01"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("minthostile")) as st:
        token = st.token()
        secrets = {n: st.secret(n.split(".")[0]) for n in NAMES}
        minted = canary.make("mintedtoken")
        st.watch(minted)
        servers: dict[str, Any] = {}
        echo = AuthServer(st.ca, ["echoerr.test"], "client-echoerr.test", secrets["echoerr.test"])
        echo.fail = (400, {"error": secrets["echoerr.test"]})  # what it was sent, as its error code
        servers["echoerr.test"] = st.serve(echo)
        servers["drip.test"] = st.serve(ScriptServer(st.ca, ["drip.test"], _drip))
        other = st.serve(AuthServer(st.ca, ["other.test"], "client-other", secrets["other.test"]))
        servers["other.test"] = other
        location = f"https://other.test:{other.port}/token"
        servers["redir.test"] = st.serve(
            ScriptServer(st.ca, ["redir.test"], lambda h: _send(h, 307, b"{}", Location=location))
        )
        servers["huge.test"] = st.serve(ScriptServer(st.ca, ["huge.test"], _huge))
        fail50 = AuthServer(st.ca, ["fail50.test"], "client-fail50.test", secrets["fail50.test"])
        fail50.fail, fail50.delay = (503, {"error": "temporarily_unavailable"}), 0.5  # all 50 wait on it
        servers["fail50.test"] = st.serve(fail50)

        def echo_api(h: BaseHTTPRequestHandler) -> None:
            if h.command == "POST":
                _send(h, 200, json.dumps({"access_token": minted, "expires_in": 3600}).encode())
                return
            auth = h.headers.get("Authorization", "")
            b64 = base64.b64encode(auth.encode()).decode()
            _send(h, 200, json.dumps({"auth": auth, "b64": b64}).encode(), X_Echo=auth)

        servers["echoapi.test"] = st.serve(ScriptServer(st.ca, ["echoapi.test"], echo_api))
        # other.test is a host of redir's credential too: the redirect is not followed even so
        hosts = {n: [n] for n in NAMES}
        hosts["redir.test"] = ["redir.test", "other.test"]
        creds = [
            credential(n.split(".")[0], _ph(n), hosts[n], kind="oauth_client",
                       mint={"token_url": f"https://{n}:{servers[n].port}/token", "client_id": f"client-{n}"})
            for n in NAMES if n != "other.test"
        ]  # fmt: skip
        text = rules([egress(n, servers[n].port) for n in NAMES], credentials=creds)
        yield World(st, st.proxy(text, NAMES), token, servers, secrets, minted)


def test_a_token_endpoint_that_answers_with_the_client_secret_as_its_error_code(world: World) -> None:
    r = world.get("echoerr.test")
    assert r.status_code == 502 and r.json()["error"] == "token_mint_failed"
    assert "http_400:unregistered" in r.json()["message"]
    secret = world.secrets["echoerr.test"]
    assert world.servers["echoerr.test"].token_requests == 1
    time.sleep(0.3)  # the log line is written
    for name, data in world.stage.artifacts().items():
        assert secret.encode() not in data, name


def test_a_dripping_token_endpoint_is_given_up_on_its_deadline(world: World) -> None:
    start = time.monotonic()
    r = world.get("drip.test", timeout=DRIP_SECONDS - 5)
    took = time.monotonic() - start
    assert r.status_code == 503 and r.json()["error"] == "token_mint_failed"
    assert "unreachable" in r.json()["message"]
    assert took < 20, took  # the mint's total deadline (10 s), not the endpoint's pace


def test_a_redirect_from_the_token_endpoint_is_not_followed(world: World) -> None:
    r = world.get("redir.test")
    assert r.status_code == 502 and "http_307" in r.json()["message"]
    assert world.servers["other.test"].token_requests == 0


def test_a_huge_token_answer_is_refused_without_reading_it_whole(world: World) -> None:
    r = world.get("huge.test")
    assert r.status_code == 502 and "bad_response" in r.json()["message"]


def test_an_api_that_echoes_the_minted_token_hands_the_sandbox_the_placeholder(world: World) -> None:
    r = world.get("echoapi.test")
    assert r.status_code == 200
    doc = r.json()
    ph = _ph("echoapi.test")
    assert doc["auth"] == f"Bearer {ph}" and r.headers["x-echo"] == f"Bearer {ph}"
    assert base64.b64decode(doc["b64"]).decode() == f"Bearer {ph}"
    assert world.minted not in r.text


def test_fifty_concurrent_requests_to_a_failing_endpoint_cause_one_token_request(world: World) -> None:
    """Held: single flight holds under failure too; the waiters share the one failure."""

    async def burst() -> list[httpx.Response]:
        url = f"https://fail50.test:{world.servers['fail50.test'].port}/api"
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        async with httpx.AsyncClient(proxy=world.proxy.url("c1", world.token), verify=ctx, timeout=30) as c:
            return list(await asyncio.gather(*(c.get(url) for _ in range(50))))

    out = asyncio.run(burst())
    assert [r.status_code for r in out] == [502] * 50
    assert {r.json()["error"] for r in out} == {"token_mint_failed"}
    assert world.servers["fail50.test"].token_requests == 1
