"""Claims bound to more than an address (issue 21): sandbox A, root in its own namespace on a
shared bridge, takes sandbox B's address while B is down. Its requests are refused, and B's
secret never leaves.

    sg-sa 10.245.0.2, fd00:245::2 ──port sg-pa-*──┐
                                                  ├─ bridge sg-br 10.245.0.1, fd00:245::1 ─ sg-host
    sg-sb 10.245.0.3, fd00:245::3 ──port sg-pb-*──┘   (surrogate; the printed fence for sg-br and
                                                        each port's printed anti-spoof rules)
                                    sg-host 10.246.0.1 ──veth── sg-up 10.246.0.2 (HTTPS)

Two layers, each shown on its own: (1) with every printed rule loaded, A's frames from B's
address are dropped on A's bridge port and reach nothing; (2) with A's port rules missing (an
operator's mistake), the proxy still refuses: B's claim says ``interface: <B's port>`` and A's
connection does not carry that port's mark (403 ``wrong_interface``, audited).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import canary
import pytest
from _netns import Lab, NsProxy, flush_rules, load_printed, missing, sh, upstream_argv
from harness import free_port
from inprocess import surrogate as in_process
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e

PH_B = "surr_SpoofVictimPlaceholder01"
UP = "10.246.0.2"
UP6 = "fd00:246::2"
A = ("10.245.0.2", "fd00:245::2")
B = ("10.245.0.3", "fd00:245::3")


@dataclass
class Bridge:
    lab: Lab
    host: str
    sa: str
    sb: str
    port_a: str
    port_b: str
    proxy: NsProxy
    tport: int
    secret: str
    record: Path
    received: list[str] = field(default_factory=list)

    def curl(self, ns: str, source: str, path: str, timeout: int = 8) -> subprocess.CompletedProcess[str]:
        name, up = ("api6.test", f"[{UP6}]") if ":" in source else ("api.test", UP)
        done = sh(
            "curl", "-sS", "--max-time", str(timeout), "--interface", source,
            "--cacert", str(self.proxy.ca_pem), "--resolve", f"{name}:443:{up}",
            "-H", f"Authorization: Bearer {PH_B}", "-w", "\n%{http_code}",
            f"https://{name}{path}", ns=ns, check=False, timeout=timeout + 10,
        )  # fmt: skip
        self.received.append(done.stdout + done.stderr)
        return done

    def upstream_paths(self) -> list[str]:
        text = self.record.read_text() if self.record.exists() else ""
        return [json.loads(line)["path"] for line in text.splitlines()]

    def printed(self, *args: str) -> str:
        return in_process("transparent-rules", "--port", str(self.tport), *args, check=True).stdout

    def port_rules(self, port: str, sources: tuple[str, str]) -> str:
        return self.printed(
            "--bridge-port", port, "--source", f"{sources[0]}/32", "--source", f"{sources[1]}/128"
        )


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    why = missing("ebtables")
    if why:
        pytest.skip(why)
    st = Stage(tmp_path_factory.mktemp("spoof"))
    st.every_canary = True  # the proxy's audit file and stderr hold no canary of the session
    with st:
        tmp = st.tmp
        secret = st.secret("b-api", tag="spoofvictim", file="secret")
        st.token("unused-in-transparent-mode", newline=False)
        st.ca.ca.private_key_pem.write_to_path(str(tmp / "ca-key.pem"))
        record = canary.exempt(tmp / "upstream.jsonl")
        lab = Lab()
        st.defer(lab.teardown)
        port_a, port_b = f"sg-pa-{lab.tag}", f"sg-pb-{lab.tag}"
        text = rules(
            [egress("api.test"), egress("api6.test")],
            claims=[
                claim("sandbox-a", sources=[f"{A[0]}/32", f"{A[1]}/128"], interface=port_a),
                claim(
                    "sandbox-b",
                    [credential("b-api", PH_B, ["api.test", "api6.test"], "file:secret")],
                    sources=[f"{B[0]}/32", f"{B[1]}/128"],
                    interface=port_b,
                ),
            ],
        )
        host, sa, sb, up = lab.add("host"), lab.add("sa"), lab.add("sb"), lab.add("up")
        sh("ip", "link", "add", "sg-br", "type", "bridge", ns=host)
        sh("ip", "link", "set", "sg-br", "up", ns=host)
        lab.addr(host, "sg-br", "10.245.0.1/24", "fd00:245::1/64")
        for ns, port, (v4, v6) in ((sa, port_a, A), (sb, port_b, B)):
            lab.link(host, port, ns, "eth0")
            sh("ip", "link", "set", port, "master", "sg-br", ns=host)
            lab.addr(ns, "eth0", f"{v4}/24", f"{v6}/64")
            lab.route(ns, "default", "via", "10.245.0.1")
            lab.route(ns, "default", "via", "fd00:245::1")
        lab.link(host, f"sg-hu-{lab.tag}", up, "eth0")
        lab.addr(host, f"sg-hu-{lab.tag}", "10.246.0.1/24", "fd00:246::1/64")
        lab.addr(up, "eth0", f"{UP}/24", f"{UP6}/64")
        lab.route(up, "default", "via", "10.246.0.1")
        lab.route(up, "default", "via", "fd00:246::1")
        lab.forwarding(host)
        key = tmp / "ca-key.pem"
        st.process(upstream_argv(up, st.ca.ca_pem, key, ["api.test", "api6.test"], [UP, UP6], record))
        tport = free_port()
        transparent = ["--transparent", f"[::]:{tport}"]
        pins = {"api.test": UP, "api6.test": UP6}
        proxy = st.proxy(text, pins, cls=partial(NsProxy, host), args=transparent)
        yield Bridge(lab, host, sa, sb, port_a, port_b, proxy, tport, secret, record)


def load_all(b: Bridge, tool: str, *, port_a_rules: bool = True) -> None:
    flush_rules(b.host)
    load_printed(b.printed("--interface", "sg-br"), b.host, tool)
    if port_a_rules:
        load_printed(b.port_rules(b.port_a, A), b.host, tool)
    load_printed(b.port_rules(b.port_b, B), b.host, tool)


def take_bs_address(b: Bridge) -> None:
    """B goes down; A adds B's addresses; the host forgets B's link-layer address."""
    sh("ip", "link", "set", "eth0", "down", ns=b.sb)
    for v4, v6 in (B,):
        sh("ip", "addr", "add", f"{v4}/24", "dev", "eth0", ns=b.sa, check=False)
        sh("ip", "addr", "add", f"{v6}/64", "dev", "eth0", "nodad", ns=b.sa, check=False)
    sh("ip", "neigh", "flush", "dev", "sg-br", ns=b.host, check=False)


def give_back(b: Bridge) -> None:
    for v4, v6 in (B,):
        sh("ip", "addr", "del", f"{v4}/24", "dev", "eth0", ns=b.sa, check=False)
        sh("ip", "addr", "del", f"{v6}/64", "dev", "eth0", ns=b.sa, check=False)
    sh("ip", "link", "set", "eth0", "up", ns=b.sb)
    sh("ip", "neigh", "flush", "dev", "sg-br", ns=b.host, check=False)
    time.sleep(0.5)


TOOLS = ["iptables", "nft"]


@pytest.mark.parametrize("tool", TOOLS)
def test_b_itself_gets_its_secret_swapped_on_its_own_port(bridge: Bridge, tool: str) -> None:
    load_all(bridge, tool)
    for family, source in zip(("v4", "v6"), B, strict=True):
        path = f"/spoof/{tool}/b-{family}"
        done = bridge.curl(bridge.sb, source, path)
        assert done.stdout.endswith("200"), done
        event = bridge.proxy.wait_event(path=path)
        assert (event["claim"], event["decision"]) == ("sandbox-b", "allow")
        assert event["credentials"] == [{"name": "b-api", "version": 1}]


@pytest.mark.parametrize("tool", TOOLS)
def test_a_with_bs_address_gets_nowhere_with_every_printed_rule(bridge: Bridge, tool: str) -> None:
    load_all(bridge, tool)
    take_bs_address(bridge)
    try:
        for family, source in zip(("v4", "v6"), B, strict=True):
            path = f"/spoof/{tool}/dropped-{family}"
            done = bridge.curl(bridge.sa, source, path, timeout=5)
            assert not done.stdout.endswith("200"), done
            time.sleep(0.3)
            assert [e for e in bridge.proxy.audit_events() if e.get("path") == path] == []
            assert path not in bridge.upstream_paths()
    finally:
        give_back(bridge)


@pytest.mark.parametrize("tool", TOOLS)
def test_without_as_port_rules_the_proxy_refuses_the_wrong_interface(bridge: Bridge, tool: str) -> None:
    load_all(bridge, tool, port_a_rules=False)
    take_bs_address(bridge)
    try:
        for family, source in zip(("v4", "v6"), B, strict=True):
            path = f"/spoof/{tool}/refused-{family}"
            done = bridge.curl(bridge.sa, source, path, timeout=20)
            assert done.stdout.endswith("403") and "wrong_interface" in done.stdout, done
            event = bridge.proxy.wait_event(path=path)
            assert (event["claim"], event["reason"], event["credentials"]) == (
                "sandbox-b",
                "wrong_interface",
                [],
            )
    finally:
        give_back(bridge)


def test_zz_bs_secret_left_only_for_b(bridge: Bridge) -> None:
    time.sleep(0.3)
    paths = bridge.upstream_paths()
    assert sorted(paths) == sorted(f"/spoof/{t}/b-{f}" for t in TOOLS for f in ("v4", "v6")), paths
    canary.assert_absent({"spoof clients": "".join(bridge.received).encode()})
