"""Issue 19: upstream TLS sessions resumed, only under the verification that made them valid.

Real curl and httpx through a real proxy to loopback upstreams (tests/servers.py, trustme CA);
each upstream records, per completed handshake, the SNI and whether it resumed a session
(``Upstream.sessions`` / ``Upstream.resumed``), so resumption is counted on the upstream's side.
Every test uses its own upstream (its own port), so the proxy's cache holds nothing for it
before the test starts. See addons/upstreamtls.py for the key and the decisions.
"""

from __future__ import annotations

import secrets
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from harness import ProxyProcess
from servers import TestCA, Upstream
from world import Stage, claim, egress, rules

pytestmark = pytest.mark.e2e

NAMES = ["api.test", "other.test", "bad.test", "wrongname.test"]
PORTS = 8  # upstreams the rules allow: each test takes its own


@dataclass
class World:
    stage: Stage
    proxy: ProxyProcess
    tokens: dict[str, str]
    ca_pem: Path
    free: list[int]  # ports of started upstreams no test has used yet
    upstreams: dict[int, Upstream]
    untrusted: Upstream  # its certificate is issued by a CA the proxy does not trust (bad.test)
    wrongname: Upstream  # trusted CA, but its certificate names only api.test

    def upstream(self) -> Upstream:
        return self.upstreams[self.free.pop()]

    def curl(
        self, who: str, host: str, port: int, path: str = "/t/resume"
    ) -> subprocess.CompletedProcess[bytes]:
        proxy = f"http://{who}:{self.tokens[who]}@127.0.0.1:{self.proxy.port}"
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy,
             "--cacert", str(self.proxy.ca_pem), f"https://{host}:{port}{path}"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        self.stage.received.append(done.stdout + done.stderr)
        return done


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("resume")) as st:
        tokens = {
            "c1": st.token(secrets.token_urlsafe(16), "token1"),
            "c2": st.token(secrets.token_urlsafe(16), "token2"),
        }
        ups = [st.upstream(["api.test", "other.test"]) for _ in range(PORTS)]
        other_dir = st.tmp / "other-ca"
        other_dir.mkdir()
        untrusted = st.serve(Upstream(TestCA(other_dir), ["bad.test"], tmpdir=st.tmp))
        wrongname = st.upstream(["api.test"])
        ports = [u.port for u in ups]
        text = rules(
            [
                egress("api.test", ports=[*ports, wrongname.port]),
                egress("other.test", ports=ports),
                egress("bad.test", ports=[untrusted.port]),
                egress("wrongname.test", ports=[wrongname.port]),
            ],
            claims=[claim("c1", token="file:token1"), claim("c2", token="file:token2")],
        )
        proxy = st.proxy(text, NAMES)
        yield World(st, proxy, tokens, st.ca.ca_pem, ports, {u.port: u for u in ups}, untrusted, wrongname)


def test_sequential_curl_connections_resume_the_upstream_session(world: World) -> None:
    up = world.upstream()
    for _ in range(4):
        done = world.curl("c1", "api.test", up.port)
        assert done.stdout == b"200", done.stderr
    assert up.sessions == ["api.test"] * 4
    assert up.resumed == [False, True, True, True]


def test_httpx_connections_resume_too(world: World) -> None:
    up = world.upstream()
    proxy = f"http://c1:{world.tokens['c1']}@127.0.0.1:{world.proxy.port}"
    trust = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
    for _ in range(3):  # a new client each time: a new tunnel, a new upstream connection
        with httpx.Client(proxy=proxy, verify=trust, timeout=20) as client:
            got = client.get(f"https://api.test:{up.port}/t/resume-httpx")
        world.stage.received.append(got.content)
        assert got.status_code == 200
    assert up.resumed == [False, True, True]


def test_another_claim_never_resumes_a_session(world: World) -> None:
    up = world.upstream()
    assert world.curl("c1", "api.test", up.port).stdout == b"200"
    assert world.curl("c2", "api.test", up.port).stdout == b"200"  # same host, address, settings
    assert world.curl("c2", "api.test", up.port).stdout == b"200"  # its own session from now on
    assert world.curl("c1", "api.test", up.port).stdout == b"200"
    assert up.resumed == [False, False, True, True]


def test_another_name_on_the_same_address_never_resumes(world: World) -> None:
    up = world.upstream()
    assert world.curl("c1", "api.test", up.port).stdout == b"200"
    assert world.curl("c1", "other.test", up.port).stdout == b"200"  # same IP and port, other SNI
    assert world.curl("c1", "other.test", up.port).stdout == b"200"
    assert up.sessions == ["api.test", "other.test", "other.test"]
    assert up.resumed == [False, False, True]


def test_another_port_never_resumes(world: World) -> None:
    first, second = world.upstream(), world.upstream()
    assert world.curl("c1", "api.test", first.port).stdout == b"200"
    assert world.curl("c1", "api.test", second.port).stdout == b"200"
    assert first.resumed == [False] and second.resumed == [False]


@pytest.mark.parametrize("which", ["untrusted", "wrongname"])
def test_a_failed_verification_is_never_cached(world: World, which: str) -> None:
    up, host = (world.untrusted, "bad.test") if which == "untrusted" else (world.wrongname, "wrongname.test")
    for _ in range(3):
        done = world.curl("c1", host, up.port)
        assert done.stdout == b"502", (done.stdout, done.stderr)
    assert up.resumed == []  # no handshake the proxy completed, and none resumed
    if which == "wrongname":  # the same upstream under its own name: verified, then resumed
        assert world.curl("c1", "api.test", up.port).stdout == b"200"
        assert world.curl("c1", "api.test", up.port).stdout == b"200"
        assert up.resumed == [False, True]
