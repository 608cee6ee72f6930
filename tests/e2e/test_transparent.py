"""Transparent mode end to end: the sandbox is a network namespace this test makes, its TCP is
redirected to the proxy by iptables, and real clients in it run with no proxy variables at all.

Topology (every address is on a veth pair this test creates):

    netns sbx  10.231.0.2 (+ .3, a source no claim owns) ──veth── 10.231.0.1  root netns
                                                                   iptables PREROUTING -i <veth>
                                                                   REDIRECT → surrogate transparent
    netns up   10.232.0.2:443  HTTPS upstream (test CA)  ──veth── 10.232.0.1  root netns

Needs root, `ip netns` and iptables; skips with the reason printed where they are missing.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import pytest
from harness import ROOT, ProxyProcess, free_port
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e

PH = "surr_TransparentPlaceholder01"
UPSTREAM_SCRIPT = """
import json, sys, time, pathlib
sys.path.insert(0, {tests!r})
from servers import TestCA, Upstream
class CA(TestCA):
    def __init__(self): pass
import trustme
ca = CA()
ca.ca = trustme.CA.from_pem(
    pathlib.Path({ca_cert!r}).read_bytes(), pathlib.Path({ca_key!r}).read_bytes()
)
up = Upstream(ca, ["api.test", "other.test", "denied.test", "opaque.test"], git_password={secret!r},
              bind=("10.232.0.2", 443)).start()
print("ready", flush=True)
sys.stdin.read()  # the test closes stdin to stop us
with open({record!r}, "w") as f:
    for r in up.requests:
        f.write(json.dumps({{"path": r.path, "headers": r.headers}}) + "\\n")
    f.write(json.dumps({{"connections": up.connections}}) + "\\n")
up.stop()
"""


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "transparent-mode test needs root (network namespaces, iptables)"
    for tool in ("ip", "iptables", "curl"):
        if shutil.which(tool) is None:
            return f"transparent-mode test needs {tool!r} (apt-get install iproute2 iptables curl)"
    probe = subprocess.run(["ip", "netns", "add", "surr-probe"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "surr-probe"], check=False)
    return None


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


@dataclass
class Net:
    tag: str
    sbx: str
    up: str
    veth_s: str
    veth_u: str
    rules: list[list[str]] = field(default_factory=list)

    def iptables(self, *rule: str) -> None:
        sh("iptables", "-t", "nat", "-A", *rule)
        self.rules.append(list(rule))

    def teardown(self) -> None:
        shutil.rmtree(f"/etc/netns/{self.sbx}", ignore_errors=True)
        for rule in reversed(self.rules):
            subprocess.run(["iptables", "-t", "nat", "-D", *rule], capture_output=True, check=False)
        for ns in (self.sbx, self.up):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def make_net() -> Net:
    tag = secrets.token_hex(3)
    net = Net(tag, f"surr-sbx-{tag}", f"surr-up-{tag}", f"sv{tag}", f"uv{tag}")
    try:
        for ns, veth, peer, inner, outer in (
            (net.sbx, net.veth_s, f"s0{tag}", "10.231.0.2/24", "10.231.0.1/24"),
            (net.up, net.veth_u, f"u0{tag}", "10.232.0.2/24", "10.232.0.1/24"),
        ):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "addr", "add", outer, "dev", veth)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", ns, "addr", "add", inner, "dev", peer)
            sh("ip", "-n", ns, "link", "set", peer, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "route", "add", "default", "via", outer.split("/")[0])
        sh("ip", "-n", net.sbx, "addr", "add", "10.231.0.3/24", "dev", f"s0{tag}")
        # `ip netns exec` bind-mounts /etc/netns/<name>/hosts over /etc/hosts: the sandbox's own
        # name resolution, so clients that take no --resolve (Node's fetch, git) find api.test
        Path(f"/etc/netns/{net.sbx}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{net.sbx}/hosts").write_text(
            "127.0.0.1 localhost\n10.232.0.2 api.test pkgs.test mcp.test\n"
        )
    except subprocess.CalledProcessError:
        net.teardown()
        raise
    return net


@dataclass
class World:
    net: Net
    proxy: ProxyProcess
    secret: str
    record: Path
    upstream: subprocess.Popen[str]
    tport: int
    services: subprocess.Popen[str]
    tmp: Path
    received: list[str] = field(default_factory=list)

    def curl(
        self, *args: str, source: str = "10.231.0.2", cacert: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """curl inside the sandbox namespace: no proxy variables, trusting only surrogate's CA
        (or only ``cacert``)."""
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        done = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.net.sbx,
                "curl",
                "-sS",
                "--max-time",
                "15",
                "--interface",
                source,
                "--cacert",
                str(cacert or self.proxy.ca_pem),
                "-w",
                "\n%{http_code}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env=env,
        )
        self.received.append(done.stdout + done.stderr)
        return done


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    why = _missing()
    if why:
        print(f"SKIP transparent e2e: {why}")
        pytest.skip(why)
    with Stage(tmp_path_factory.mktemp("transparent")) as st:
        tmp = st.tmp
        # not a registered canary: the upstreams' records of what they received hold it by design
        secret = f"CANARYtransparent{secrets.token_hex(12)}"
        (tmp / "secret").write_text(secret)
        st.watch(secret)
        st.token("unused-in-transparent-mode", newline=False)
        st.ca.ca.private_key_pem.write_to_path(str(tmp / "ca-key.pem"))
        text = rules(
            [
                egress("api.test", ports=[443, 8443]),
                egress("api.test", 80, scheme="http"),
                egress("other.test"),
                egress("pkgs.test", 9443),
                egress("mcp.test", 10443),
                egress("opaque.test", intercept=False),
            ],
            claims=[
                claim(
                    "sandbox",
                    [credential("api", PH, ["api.test", "pkgs.test", "mcp.test"], "file:secret")],
                    sources=["10.231.0.2/32"],
                )
            ],
        )
        script = UPSTREAM_SCRIPT.format(
            tests=str(ROOT / "tests"),
            ca_cert=str(st.ca.ca_pem),
            ca_key=str(tmp / "ca-key.pem"),
            record=str(tmp / "upstream.jsonl"),
            secret=secret,
        )  # before make_net: nothing to tear down if this fails
        record = tmp / "upstream.jsonl"
        net = make_net()
        st.defer(net.teardown)
        upstream = st.process(["ip", "netns", "exec", net.up, sys.executable, "-c", script], timeout=20)
        services = st.process(
            [
                "ip",
                "netns",
                "exec",
                net.up,
                sys.executable,
                str(ROOT / "tests" / "e2e" / "_netns_services.py"),
                "--ca-cert",
                str(st.ca.ca_pem),
                "--ca-key",
                str(tmp / "ca-key.pem"),
                "--secret-file",
                str(tmp / "secret"),
                "--record",
                str(tmp / "services.json"),
                "--tmp",
                str(tmp),
            ]
        )
        tport = free_port()
        proxy = st.proxy(
            text,
            {
                "api.test": "10.232.0.2",
                "other.test": "10.232.0.9",
                "pkgs.test": "10.232.0.2",
                "mcp.test": "10.232.0.2",
                "opaque.test": "10.232.0.2",
            },
            start=False,
            # 0.0.0.0: the loop test below redirects the proxy's own outbound traffic back to it
            args=["--transparent", f"0.0.0.0:{tport}"],
        )
        # Everything the sandbox sends over TCP goes to surrogate; the proxy's own traffic leaves
        # through OUTPUT, which this rule does not touch, so it cannot loop.
        # the rule `surrogate transparent-rules --interface` prints, applied as printed
        printed = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "transparent-rules",
                "--port",
                str(tport),
                "--interface",
                net.veth_s,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        rule = next(line for line in printed.splitlines() if line.startswith("iptables "))
        net.iptables(*rule.split()[4:])  # after "iptables -t nat -A"
        proxy.start()
        yield World(net, proxy, secret, record, upstream, tport, services, tmp)


def upstream_saw(world: World) -> list[dict]:
    """What the upstream recorded (it writes the record when it stops, so this is read last)."""
    return (
        [json.loads(line) for line in world.record.read_text().splitlines()] if world.record.exists() else []
    )


def test_curl_in_the_sandbox_gets_the_secret_swapped_without_proxy_settings(world: World) -> None:
    done = world.curl(
        "--resolve",
        "api.test:443:10.232.0.2",
        "-H",
        f"Authorization: Bearer {PH}",
        "https://api.test/t/transparent",
    )
    assert done.stdout.endswith("200"), done
    assert world.secret not in done.stdout
    event = world.proxy.wait_event(path="/t/transparent")
    assert (event["claim"], event["decision"], event["host"]) == ("sandbox", "allow", "api.test")
    assert event["credentials"] == [{"name": "api", "version": 1}]


def test_http2_client_in_transparent_mode(world: World) -> None:
    done = world.curl(
        "--http2",
        "--resolve",
        "api.test:443:10.232.0.2",
        "-H",
        f"X-Api-Key: {PH}",
        "https://api.test/t/transparent-h2",
    )
    assert done.stdout.endswith("200"), done
    assert world.proxy.wait_event(path="/t/transparent-h2")["credentials"] == [{"name": "api", "version": 1}]


NODE_CLIENT = """
const https = require("https");
const req = https.request({host: "10.232.0.2", port: 443, path: "/t/transparent-node", servername: "api.test",
  headers: {Host: "api.test", Authorization: "Bearer " + process.env.PH}}, (res) => {
  let body = ""; res.on("data", (c) => body += c); res.on("end", () => console.log(res.statusCode));
});
req.on("error", (e) => { console.error(e.message); process.exit(1); });
req.end();
"""


def sandbox_node(world: World, script: str, path: str) -> None:
    """Run ``script`` with node inside the sandbox namespace (no proxy variables, only the CA
    trusted); it must print 200, and the request at ``path`` must have carried the secret."""
    env = {"PATH": os.environ["PATH"], "PH": PH, "NODE_EXTRA_CA_CERTS": str(world.proxy.ca_pem)}
    done = subprocess.run(
        ["ip", "netns", "exec", world.net.sbx, "node", "-e", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    world.received.append(done.stdout + done.stderr)
    assert done.stdout.strip() == "200", done.stderr
    assert world.proxy.wait_event(path=path)["credentials"] == [{"name": "api", "version": 1}]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_https_client_with_no_proxy_support_at_all(world: World) -> None:
    """Node's https module ignores proxy variables entirely: transparent mode is the only way."""
    sandbox_node(world, NODE_CLIENT, "/t/transparent-node")


NODE_FETCH = """
fetch("https://api.test/t/transparent-fetch", {headers: {Authorization: "Bearer " + process.env.PH}})
  .then((r) => console.log(r.status)).catch((e) => { console.error(String(e.cause || e)); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_fetch_which_ignores_proxy_variables(world: World) -> None:
    sandbox_node(world, NODE_FETCH, "/t/transparent-fetch")


def test_git_clone_in_the_sandbox_without_proxy_settings(world: World, tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GIT_SSL_CAINFO": str(world.proxy.ca_pem),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            world.net.sbx,
            "git",
            "clone",
            f"https://git:{PH}@api.test/git/repo.git",
            str(tmp_path / "clone"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    world.received.append(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "clone" / "README").read_text() == "hello from upstream\n"


def sandbox_python(world: World, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A Python program inside the sandbox namespace: no proxy variables, only the CA trusted."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(world.tmp),
        "PH": PH,
        "CA": str(world.proxy.ca_pem),
        "PIP_CONFIG_FILE": "/dev/null",
        "PYTHONNOUSERSITE": "1",
    }
    done = subprocess.run(
        ["ip", "netns", "exec", world.net.sbx, sys.executable, *(["-c", script] if script else []), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    world.received.append(done.stdout + done.stderr)
    return done


WS_CLIENT = """
import os, ssl
from websockets.sync.client import connect
ctx = ssl.create_default_context(cafile=os.environ["CA"])
with connect("wss://api.test:8443/ws", ssl=ctx, proxy=None,
             additional_headers={"Authorization": "Bearer " + os.environ["PH"]}) as ws:
    for i in range(5):
        ws.send(f"m{i}")
        print(ws.recv(timeout=5))
"""


def test_websocket_client_in_the_sandbox(world: World) -> None:
    done = sandbox_python(world, WS_CLIENT)
    assert done.stdout.split() == [f"echo:m{i}" for i in range(5)], done.stderr


PY_CLIENTS = """
import os, ssl
import httpx, requests
h = {"X-Api-Key": os.environ["PH"]}
url = "https://api.test/t/transparent-requests"
print(requests.get(url, headers=h, verify=os.environ["CA"], timeout=20).status_code)
ctx = ssl.create_default_context(cafile=os.environ["CA"])
with httpx.Client(verify=ctx, trust_env=False) as c:
    print(c.get("https://api.test/t/transparent-httpx", headers=h).status_code)
"""


def test_python_requests_and_httpx_in_the_sandbox(world: World) -> None:
    done = sandbox_python(world, PY_CLIENTS)
    assert done.stdout.split() == ["200", "200"], done.stderr[-2000:]
    for path in ("/t/transparent-requests", "/t/transparent-httpx"):
        assert world.proxy.wait_event(path=path)["credentials"] == [{"name": "api", "version": 1}]


def test_git_push_in_the_sandbox(world: World, tmp_path: Path) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "GIT_SSL_CAINFO": str(world.proxy.ca_pem),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
    }

    def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ip", "netns", "exec", world.net.sbx, "git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
            cwd=cwd,
        )
        world.received.append(done.stdout + done.stderr)
        return done

    assert git("clone", f"https://git:{PH}@api.test/git/repo.git", str(tmp_path / "w")).returncode == 0
    (tmp_path / "w" / "from-netns.txt").write_text("pushed from the sandbox namespace\n")
    assert git("add", "from-netns.txt", cwd=tmp_path / "w").returncode == 0
    assert git("commit", "-m", "transparent push", cwd=tmp_path / "w").returncode == 0
    pushed = git("push", "origin", "HEAD", cwd=tmp_path / "w")
    assert pushed.returncode == 0, pushed.stderr


def test_pip_install_in_the_sandbox_from_a_credentialed_index(world: World) -> None:
    target = world.tmp / "pip-target"
    done = sandbox_python(
        world,
        "",
        "-m",
        "pip",
        "install",
        "--index-url",
        f"https://ci:{PH}@pkgs.test:9443/simple/",
        "--cert",
        str(world.proxy.ca_pem),
        "--target",
        str(target),
        "--no-cache-dir",
        "--disable-pip-version-check",
        "surrogate-netns-demo",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "surrogate_netns_demo.py").exists()


MCP_CLIENT = """
import asyncio, os, ssl
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    ctx = ssl.create_default_context(cafile=os.environ["CA"])
    http = httpx2.AsyncClient(verify=ctx, trust_env=False, timeout=20,
                              headers={"Authorization": "Bearer " + os.environ["PH"]})
    async with http, streamable_http_client("https://mcp.test:10443/mcp", http_client=http) as (r, w), \
            ClientSession(r, w, read_timeout_seconds=20) as session:
        await session.initialize()
        result = await session.call_tool("stepwise", {})
        print([c.text for c in result.content if c.type == "text"])

asyncio.run(main())
"""


def test_mcp_client_in_the_sandbox(world: World) -> None:
    done = sandbox_python(world, MCP_CLIENT)
    assert done.stdout.strip() == "['stepwise done']", done.stderr[-2000:]


def test_a_source_no_claim_owns_is_refused(world: World) -> None:
    done = world.curl(
        "--resolve", "api.test:443:10.232.0.2", "https://api.test/t/stranger", source="10.231.0.3"
    )
    assert done.stdout.endswith("403") and "unknown_source" in done.stdout
    assert world.proxy.wait_event(path="/t/stranger")["reason"] == "unknown_source"


def test_a_name_that_does_not_belong_to_the_destination_gets_421(world: World) -> None:
    """The sandbox connects to api.test's address but names other.test (whose address is another):
    the guest-chosen destination is never trusted."""
    done = world.curl("--resolve", "other.test:443:10.232.0.2", "https://other.test/t/reroute")
    assert done.stdout.endswith("421") and "authority_mismatch" in done.stdout


def test_denied_host_is_refused_before_any_upstream_connection(world: World) -> None:
    done = world.curl("--resolve", "denied.test:443:10.232.0.2", "https://denied.test/t/denied")
    assert done.stdout.endswith("403") and "no_rule" in done.stdout


def test_placeholder_over_cleartext_port_80_is_refused(world: World) -> None:
    done = world.curl(
        "--resolve",
        "api.test:80:10.232.0.2",
        "-H",
        f"Authorization: Bearer {PH}",
        "http://api.test/t/cleartext",
    )
    assert done.stdout.endswith("403") and "cleartext_credential" in done.stdout


def test_a_redirect_without_the_exclusion_is_refused_once_not_a_loop(world: World) -> None:
    """An operator forgets to exclude the proxy's own traffic: its connection to the upstream is
    redirected back into itself. The inner connection comes from no claim's address and is
    refused; the outer request fails once. Nothing spins."""
    rule = [
        "OUTPUT",
        "-d",
        "10.232.0.2",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-j",
        "REDIRECT",
        "--to-ports",
        str(world.tport),
    ]
    sh("iptables", "-t", "nat", "-A", *rule)
    try:
        done = world.curl("--resolve", "api.test:443:10.232.0.2", "https://api.test/t/loop")
    finally:
        sh("iptables", "-t", "nat", "-D", *rule)
    assert done.stdout.endswith("502"), done
    time.sleep(0.5)
    events = [e for e in world.proxy.audit_events() if e["path"] == "/t/loop"]
    # one outer request (upstream error) and at most one inner refusal: no loop
    assert 1 <= len(events) <= 2 and events[-1]["decision"] == "error"
    again = world.curl("--resolve", "api.test:443:10.232.0.2", "https://api.test/t/after-loop")
    assert again.stdout.endswith("200")


def test_an_opaque_rule_passes_tls_through_and_is_audited(world: World) -> None:
    """Regression: a transparent pass-through wrote no audit event at all. Trusting only the
    upstream's CA proves the TLS was not intercepted; the placeholder goes out unswapped."""
    done = world.curl(
        "--resolve",
        "opaque.test:443:10.232.0.2",
        "-H",
        f"Authorization: Bearer {PH}",
        "https://opaque.test/t/opaque",
        cacert=world.tmp / "upstream-ca.pem",
    )
    assert done.stdout.endswith("200"), done
    event = world.proxy.wait_event(event="tunnel", host="opaque.test")
    assert (event["claim"], event["decision"], event["reason"]) == ("sandbox", "allow", "allowed")
    assert (event["method"], event["status"], event["port"]) == (None, None, 443)
    assert event["rule"] is not None and "opaque.test" in event["rule"]
    schema = json.loads((ROOT / "docs" / "audit-schema.json").read_text())
    jsonschema.validate(event, schema)


def test_an_opaque_sni_naming_another_address_is_intercepted_and_refused(world: World) -> None:
    """The sandbox connects to 10.232.0.9 but names opaque.test (10.232.0.2): not passed through
    (nothing would check where it goes), but intercepted; inside an intercepted connection only
    intercepting rules decide, so its request is refused."""
    done = world.curl("--resolve", "opaque.test:443:10.232.0.9", "https://opaque.test/t/opaque-elsewhere")
    assert done.stdout.endswith("403") and "no_rule" in done.stdout
    assert world.proxy.wait_event(path="/t/opaque-elsewhere")["reason"] == "no_rule"
    passed = [e for e in world.proxy.audit_events() if e["event"] == "tunnel" and e["host"] == "opaque.test"]
    assert len(passed) <= 1  # only the previous test's pass-through, if it ran


BAD_SNI_CLIENT = """
import os, socket, ssl, sys
ctx = ssl.create_default_context(cafile=os.environ["CA"])
ctx.check_hostname = False  # the name is meant to be one no certificate holds
with socket.create_connection(("10.232.0.2", 443), timeout=10) as raw:
    with ctx.wrap_socket(raw, server_hostname=sys.argv[1]) as tls:
        tls.sendall(f"GET {sys.argv[2]} HTTP/1.1\\r\\nHost: api.test\\r\\n"
                    f"Authorization: Bearer {os.environ['PH']}\\r\\nConnection: close\\r\\n\\r\\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
print(data.decode(errors="replace"))
"""


@pytest.mark.parametrize("sni", ["free.test:443", "opaque.test:8443", "api.test/x"])
def test_an_sni_mitmproxy_cannot_read_as_a_host_is_refused_not_ignored(world: World, sni: str) -> None:
    """mitmproxy's ClientHello.sni drops a server name that is not one valid host name, and the
    request was decided on its Host alone: a 200 with the secret swapped in (attack session
    2026-12-04). Now 421, and nothing reaches the upstream (the last test checks its paths)."""
    done = sandbox_python(world, BAD_SNI_CLIENT, sni, "/t/bad-sni")
    assert done.stdout.startswith("HTTP/1.1 421") and "server name" in done.stdout, done.stdout + done.stderr


NOT_HTTP_CLIENT = """
import socket, sys, time
port, payload = int(sys.argv[1]), sys.argv[2].encode().decode("unicode_escape").encode("latin-1")
with socket.create_connection(("10.232.0.2", port), timeout=10) as s:
    s.sendall(payload)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        pass
print(repr(data))
"""


@pytest.mark.parametrize(
    ("port", "payload"),
    [(443, "SSH-2.0-OpenSSH_9.6\\r\\n"), (80, "PING\\r\\n")],
    ids=["ssh-banner-to-443", "redis-ping-to-80"],
)
def test_bytes_that_are_not_http_in_a_redirected_connection_are_refused_and_audited(
    world: World, port: int, payload: str
) -> None:
    """Was: a redirected connection whose first bytes were not HTTP became mitmproxy's raw TCP
    layer and was relayed to the original destination, decided by no rule."""
    before = len(world.proxy.audit_events())
    done = sandbox_python(world, NOT_HTTP_CLIENT, str(port), payload)
    assert done.returncode == 0 and done.stdout.strip() == "b''", done
    deadline = time.monotonic() + 5
    found: list[dict] = []
    while not found and time.monotonic() < deadline:
        found = [e for e in world.proxy.audit_events()[before:] if e["reason"] == "not_http"]
        time.sleep(0.05)
    assert [(e["event"], e["claim"], e["host"], e["port"]) for e in found] == [
        ("tunnel", "sandbox", "10.232.0.2", port)
    ]
    jsonschema.validate(found[0], json.loads((ROOT / "docs" / "audit-schema.json").read_text()))


SPLIT_HELLO_CLIENT = """
import os, socket, ssl, sys, time
split = int(sys.argv[1])
raw = socket.create_connection(("10.232.0.2", 443), timeout=10)
tls = ssl.create_default_context(cafile=os.environ["CA"]).wrap_bio(
    incoming := ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="api.test")
first = True
while True:
    try:
        tls.do_handshake()
        break
    except ssl.SSLWantReadError:
        data = outgoing.read()
        if first:
            raw.sendall(data[:split])
            time.sleep(0.3)
            data, first = data[split:], False
        raw.sendall(data)
        got = raw.recv(65536)
        if not got:
            sys.exit("closed during the handshake")
        incoming.write(got)
tls.write(b"GET /t/split-hello-%d HTTP/1.1\\r\\nHost: api.test\\r\\nConnection: close\\r\\n\\r\\n" % split)
raw.sendall(outgoing.read())
data = b""
while got := raw.recv(65536):
    incoming.write(got)
    try:
        while chunk := tls.read(65536):
            data += chunk
    except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
        pass
print(data.split(b"\\r\\n", 1)[0].decode())
"""


@pytest.mark.parametrize("split", [1, 2], ids=["first-byte", "first-two-bytes"])
def test_a_client_hello_split_over_reads_in_a_redirected_connection_is_still_tls(
    world: World, split: int
) -> None:
    """Was (review r5): a redirected connection whose ClientHello's first one or two bytes came
    in a read of their own was closed as not_http (mitmproxy needs three bytes to see TLS)."""
    done = sandbox_python(world, SPLIT_HELLO_CLIENT, str(split))
    assert done.returncode == 0 and done.stdout.strip() == "HTTP/1.1 200 OK", done


def _echoed_hosts(stdout: str) -> list[str]:
    """The Host values /echo repeated (one raw line per header value): lines naming api.test."""
    return [line for line in stdout.splitlines() if line.split(":")[0] in ("api.test", "API.Test.")]


def test_an_absolute_form_request_without_host_reaches_the_upstream_with_the_decided_host(
    world: World,
) -> None:
    """Review r-h2auth: an absolute-form target and no Host field (curl ``-H "Host:"``) reached
    the upstream in origin form with no Host at all; it now carries the decided authority."""
    done = world.curl(
        "--http1.1", "--resolve", "api.test:443:10.232.0.2", "-H", "Host:",
        "--request-target", "https://api.test/echo?t=authority-abs", "https://api.test/",
    )  # fmt: skip
    assert done.stdout.endswith("200"), done.stdout + done.stderr
    assert "api.test" in _echoed_hosts(done.stdout), done.stdout


def test_an_http2_authority_in_another_spelling_reaches_the_upstream_canonical(world: World) -> None:
    done = world.curl(
        "--http2", "--resolve", "api.test:443:10.232.0.2", "-H", "Host: API.Test.",
        "https://api.test/echo?t=authority-h2",
    )  # fmt: skip
    assert done.stdout.endswith("200"), done.stdout + done.stderr
    hosts = _echoed_hosts(done.stdout)
    assert "api.test" in hosts and "API.Test." not in hosts, done.stdout


def test_an_http2_authority_naming_another_host_than_the_sni_gets_421(world: World) -> None:
    done = world.curl(
        "--http2", "--resolve", "api.test:443:10.232.0.2", "-H", "Host: other.test",
        "https://api.test/t/authority-other",
    )  # fmt: skip
    assert done.stdout.endswith("421") and "authority_mismatch" in done.stdout, done.stdout


def test_zz_upstream_saw_only_the_allowed_requests_with_the_real_secret(world: World) -> None:
    """Runs last in this module: stops the upstream to read what it recorded."""
    assert world.upstream.stdin is not None
    world.upstream.stdin.close()
    world.upstream.wait(timeout=20)
    seen = upstream_saw(world)
    paths = [r["path"] for r in seen if "path" in r]
    expected = [
        "/t/after-loop",
        "/t/transparent",
        "/t/transparent-h2",
        "/t/transparent-requests",
        "/t/transparent-httpx",
        "/t/opaque",
        "/t/split-hello-1",
        "/t/split-hello-2",
    ]
    expected += ["/t/transparent-node", "/t/transparent-fetch"] if shutil.which("node") else []
    expected += ["/echo?t=authority-abs", "/echo?t=authority-h2"]  # review r-h2auth
    assert sorted(p for p in paths if not p.startswith("/git/")) == sorted(expected)
    assert any(p.startswith("/git/repo.git/info/refs") for p in paths)
    auth = [
        v
        for r in seen
        if r.get("path") == "/t/transparent"
        for k, v in r["headers"]
        if k.lower() == "authorization"
    ]
    assert auth == [f"Bearer {world.secret}"]
    # deny, unknown source, mismatch and cleartext made no upstream connection at all
    # the allowed requests (git's several among them) and nothing for the refused ones
    assert seen[-1]["connections"] <= 24  # 20, the two split-ClientHello and two authority requests
    for text in world.received:
        assert world.secret not in text
    # the WebSocket, package index and MCP servers saw only the real secret
    assert world.services.stdin is not None
    world.services.stdin.close()
    world.services.wait(timeout=30)
    services = json.loads((world.tmp / "services.json").read_text())
    assert services["ws"] == [f"Bearer {world.secret}"]
    basic = "Basic " + base64.b64encode(f"ci:{world.secret}".encode()).decode()
    assert services["pip"] and set(services["pip"]) == {basic}
    assert services["mcp"] and set(services["mcp"]) == {f"Bearer {world.secret}"}


def test_an_upstream_failure_in_transparent_mode_is_surrogates_json(world: World) -> None:
    """Nothing listens on the upstream's port 80 (review r-refusals): a redirected request that
    mitmproxy cannot connect gets surrogate's 502 with its RFC 9209 type, not mitmproxy's page."""
    done = world.curl("-v", "--resolve", "api.test:80:10.232.0.2", "http://api.test/t/refused-upstream")
    assert done.stdout.endswith("502"), done.stdout + done.stderr
    body = json.loads(done.stdout.rsplit("\n", 1)[0])
    assert body["error"] == "upstream_error" and "refused the connection" in body["message"]
    assert "< HTTP/1.1 502 Bad Gateway (upstream_error)" in done.stderr and "mitmproxy" not in done.stderr
    assert (
        'Proxy-Status: surrogate;error=connection_refused;details="upstream_error; request_id=' in done.stderr
    )
    event = world.proxy.wait_event(path="/t/refused-upstream")
    assert (event["reason"], event["status"], event["request_id"]) == (
        "upstream_error",
        502,
        body["request_id"],
    )
