"""Regression tests for what an adversarial review of the proxy found, each with its failing
input: a hostile sandbox sends real bytes at a running proxy over loopback."""

from __future__ import annotations

import base64
import secrets
import socket
import ssl
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import ProxyProcess, free_port
from servers import TestCA, Upstream

pytestmark = pytest.mark.e2e

PH = "surr_HostileTestPlaceholder001"


@dataclass
class World:
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str
    received: list[bytes]

    def url(self, path: str, host: str = "api.test") -> str:
        return f"https://{host}:{self.upstream.port}{path}"

    def curl(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "20",
                "-x",
                self.proxy.url("agent", self.token),
                "--cacert",
                str(self.proxy.ca_pem),
                "-w",
                "\n%{http_code}",
                *args,
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        self.received.append(done.stdout + done.stderr)
        return done

    def paths(self, prefix: str) -> list[str]:
        return [r.path for r in self.upstream.requests if r.path.startswith(prefix)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("hostile")
    secret, token = f"CANARYhostile{secrets.token_hex(12)}", secrets.token_urlsafe(16)
    (tmp / "secret").write_text(secret)
    (tmp / "token").write_text(token)
    ca = TestCA(tmp)
    upstream = Upstream(ca, ["api.test", "other.test", "evil.test"], tmpdir=tmp).start()
    rules = tmp / "rules.yaml"
    rules.write_text(
        textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            egress:
              - host: api.test
                ports: [{upstream.port}]
                methods: [GET]
                paths: ["/v1"]
              - host: other.test
                ports: [{upstream.port}]
              # a catch-all opaque rule after the intercepting one: it must never approve a
              # request inside an intercepted tunnel
              - host: "*"
                ports: [{upstream.port}]
                intercept: false
        claims:
          - id: agent
            pool: p
            proxy_token: file:token
            credentials:
              - name: api
                value: file:secret
                placeholder: {PH}
                hosts: [api.test]
        """)
    )
    proxy = ProxyProcess(
        rules,
        tmp,
        upstream_ca=ca.ca_pem,
        resolve={n: "127.0.0.1" for n in ("api.test", "other.test", "evil.test")},
    )
    w = World(upstream, proxy, token, secret, [])
    try:
        proxy.start()
        yield w
    finally:
        proxy.stop()
        upstream.stop()
    everything = b"".join(w.received) + proxy.audit_path.read_bytes() + proxy.stderr_path.read_bytes()
    assert secret.encode() not in everything


@pytest.mark.parametrize(
    "port",
    ["²", "1" * 5000, "-1", "65536", "0x50"],
    ids=["superscript-two", "5000-digits", "negative", "too-big", "hex"],
)
def test_a_malformed_host_port_is_refused_not_waved_through(world: World, port: str) -> None:
    """Was: Host 'api.test:²' made int() raise inside the policy hook; mitmproxy logged it and let
    the request through, skipping every rule and still swapping the secret."""
    done = world.curl(
        "--http1.1",
        "-X",
        "DELETE",
        "-H",
        f"Host: api.test:{port}",
        "-H",
        f"Authorization: Bearer {PH}",
        world.url(f"/admin/{port[:3]}"),
    )
    assert int(done.stdout.rsplit(b"\n", 1)[-1]) in (400, 421), done
    assert world.paths("/admin") == []


def test_a_later_opaque_rule_never_approves_a_request_in_an_intercepted_tunnel(world: World) -> None:
    """Was: POST /admin on api.test (intercepting rule: GET /v1 only) was allowed by the later
    `*` rule with intercept: false, and got the secret."""
    done = world.curl(
        "-X", "POST", "-d", "x=1", "-H", f"Authorization: Bearer {PH}", world.url("/admin/delete")
    )
    assert done.stdout.endswith(b"403") and b"method_not_allowed" in done.stdout
    assert world.paths("/admin") == []
    ok = world.curl("-H", f"Authorization: Bearer {PH}", world.url("/v1/ok"))
    assert ok.stdout.endswith(b"200")


@pytest.mark.parametrize(
    "header",
    [
        "Basic\t" + base64.b64encode(f"x:{PH}".encode()).decode(),
        "Basic " + base64.b64encode(f"xx:{PH}".encode()).decode().rstrip("="),
        "Basic "
        + " ".join(base64.b64encode(f"x:{PH}".encode()).decode()[i : i + 8] for i in range(0, 44, 8)),
    ],
    ids=["tab-separator", "no-padding", "spaces-inside"],
)
def test_odd_basic_spellings_still_count_as_a_placeholder(world: World, header: str) -> None:
    done = world.curl("--http1.1", "-H", f"Authorization: {header}", world.url("/odd-basic", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout


def test_percent_encoded_placeholder_in_the_query_is_a_violation(world: World) -> None:
    encoded = PH.replace("_", "%5F")
    done = world.curl(world.url(f"/q?key={encoded}", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/q") == []


def test_refused_connect_leaves_no_tunnel_behind(world: World) -> None:
    """Was: after a refused CONNECT, the next plain-HTTP request on the same connection was
    judged against the refused tunnel's host (421)."""
    auth = base64.b64encode(f"agent:{world.token}".encode()).decode()
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(
            f"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test:443\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        first = s.recv(65536)
        other = f"other.test:{world.upstream.port}"
        s.sendall(
            f"GET http://{other}/after HTTP/1.1\r\nHost: {other}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\nConnection: close\r\n\r\n".encode()
        )
        second = b""
        while chunk := s.recv(65536):
            second += chunk
    assert first.startswith(b"HTTP/1.1 403")
    assert b"421" not in second.split(b"\r\n", 1)[0]


def test_refused_request_with_a_large_body_is_not_buffered(world: World) -> None:
    """Was: a 407 (before any authentication) buffered an 800 MB body in full."""
    pid = world.proxy.proc.pid if world.proxy.proc else 0
    before = rss_kib(pid)
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(
            b"POST http://other.test/upload HTTP/1.1\r\nHost: other.test\r\nContent-Length: 300000000\r\n\r\n"
        )
        sent = 0
        block = b"\0" * 65536
        try:
            while sent < 300_000_000:
                s.sendall(block)
                sent += len(block)
        except OSError:
            pass  # the proxy closed the connection: what we want
    assert sent < 300_000_000
    assert rss_kib(pid) - before < 50 * 1024


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize(
    "spelling", ["127.0.0.1", "127.1", "0x7f000001", "2130706433", "[::ffff:127.0.0.1]", "localhost", "[::1]"]
)
def test_the_proxy_never_connects_to_its_own_listener(tmp_path: Path, spelling: str) -> None:
    """A pool that allows everything still cannot make the proxy talk to itself (a loop)."""
    (tmp_path / "token").write_text("selftoken")
    port = free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\npools:\n  p:\n    egress:\n"
        "      - host: '*'\n        ports: []\n        intercept: false\n"
        "claims:\n  - id: c\n    pool: p\n    proxy_token: file:token\n"
    )
    proxy = ProxyProcess(rules, tmp_path)
    proxy.port = port
    proxy.args[proxy.args.index("--listen") + 1] = f"127.0.0.1:{port}"
    proxy.start()
    try:
        base = ["curl", "-sS", "--max-time", "10", "-x", proxy.url("c", "selftoken"), "-o", "/dev/null"]
        plain = subprocess.run(
            [*base, "-w", "%{http_code}", f"http://{spelling}:{port}/"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        tunnel = subprocess.run(
            [*base, "-k", f"https://{spelling}:{port}/"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        events = proxy.audit_events()
    finally:
        proxy.stop()
    assert plain.stdout == "403", plain
    assert [e["reason"] for e in events if e["event"] == "request"] == ["own_listener"]
    # the opaque tunnel is allowed by the rule, but its upstream connection is refused: curl
    # gets a closed tunnel, and the proxy saw exactly one CONNECT (no loop through itself)
    assert tunnel.returncode != 0
    assert len([e for e in events if e["method"] == "CONNECT"]) == 1


@pytest.mark.parametrize("allow", [False, True], ids=["refused", "allowed-by-allow_cidrs"])
def test_a_name_resolving_to_a_special_address_is_refused_unless_allowed(tmp_path: Path, allow: bool) -> None:
    """DNS (here /etc/hosts: localhost) answers loopback for an allowed name: refused after
    resolution, unless the pool lists the network in allow_cidrs."""
    ca = TestCA(tmp_path)
    upstream = Upstream(ca, ["localhost"], tmpdir=tmp_path).start()
    (tmp_path / "token").write_text("t")
    extra = "    allow_cidrs: [127.0.0.0/8]\n" if allow else ""
    (tmp_path / "rules.yaml").write_text(
        f"version: 1\npools:\n  p:\n{extra}    egress:\n"
        f"      - host: localhost\n        ports: [{upstream.port}]\n"
        "claims:\n  - id: c\n    pool: p\n    proxy_token: file:token\n"
    )
    proxy = ProxyProcess(tmp_path / "rules.yaml", tmp_path, upstream_ca=ca.ca_pem).start()
    try:
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "-x",
                proxy.url("c", "t"),
                "--cacert",
                str(proxy.ca_pem),
                "-w",
                "\n%{http_code}",
                f"https://localhost:{upstream.port}/special",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    finally:
        proxy.stop()
        upstream.stop()
    if allow:
        assert done.stdout.endswith("200"), done
    else:
        assert done.stdout.endswith("403") and "special_address" in done.stdout, done
        assert upstream.requests == []


def raw_request(world: World, head: bytes) -> bytes:
    """Send a raw HTTP/1.1 request head through an authenticated CONNECT tunnel to api.test."""
    auth = base64.b64encode(f"agent:{world.token}".encode()).decode()
    port = world.upstream.port
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
        with ctx.wrap_socket(raw, server_hostname="api.test") as tls:
            tls.sendall(head)
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    world.received.append(data)
    return data


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        (b"Host: other.test\r\n", b"400"),
        (b"X-Bad: a\x01b\r\n", b"400"),
        (b"".join(b"X-N%d: v\r\n" % i for i in range(250)), b"431"),
    ],
    ids=["duplicate-host", "control-character", "too-many-headers"],
)
def test_ambiguous_request_heads_are_refused(world: World, extra: bytes, status: bytes) -> None:
    port = world.upstream.port
    head = (
        f"GET /v1/hygiene HTTP/1.1\r\nHost: api.test:{port}\r\n".encode()
        + extra
        + f"Authorization: Bearer {PH}\r\nConnection: close\r\n\r\n".encode()
    )
    data = raw_request(world, head)
    assert data.split(b"\r\n", 1)[0].split(b" ")[1] in (status, b"400"), data[:200]
    assert world.paths("/v1/hygiene") == []


def test_trace_toward_a_credentialed_host_is_refused(world: World) -> None:
    done = world.curl("-X", "TRACE", "-H", f"Authorization: Bearer {PH}", world.url("/v1/trace"))
    assert done.stdout.endswith(b"405")
    assert world.paths("/v1/trace") == []


def test_hop_by_hop_headers_never_reach_the_upstream(world: World) -> None:
    done = world.curl(
        "--http1.1",
        "-H",
        "Connection: X-Hop",
        "-H",
        "X-Hop: secret-ish",
        "-H",
        "Keep-Alive: 5",
        "-H",
        "X-Keep: 1",
        world.url("/v1/hop"),
    )
    assert done.stdout.endswith(b"200")
    [rec] = [r for r in world.upstream.requests if r.path == "/v1/hop"]
    names = {k.lower() for k, _ in rec.headers}
    assert "x-hop" not in names and "keep-alive" not in names and "x-keep" in names
