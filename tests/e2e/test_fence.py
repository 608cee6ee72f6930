"""The transparent-mode fence, tried as a hostile sandbox would (issue 21): for each form
(``--interface``, ``--source``, ``--uid``) and each tool (iptables + ip6tables, nft), the rules
``surrogate transparent-rules`` prints are loaded verbatim and the sandbox tries every way out.

Topology (all namespaces made here, names ``sg-*``; the proxy runs in the host namespace, so no
rule is ever loaded in the root namespace):

    sg-sbx  10.241.0.2, fd00:241::2 ──veth── 10.241.0.1, fd00:241::1   sg-host (surrogate,
                                                                        forwarding on, the rules;
    user 4241 in sg-host: the --uid form's sandbox                      --transparent [::]:T)
                                             10.242.0.1, fd00:242::1 ──veth── sg-up 10.242.0.2,
                                                          fd00:242::2 (HTTPS, both families),
                                                          10.242.0.3, fd00:242::3 (no rule: denied)

The upstream namespace counts, before anything else sees them, packets from the sandbox's
addresses, to the denied addresses, all UDP and every ICMP echo request: every count must stay 0.
"""

from __future__ import annotations

import json
import re
import shutil
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

PH = "surr_FencePlaceholder0000001"
PH_BOUND = "surr_FenceBoundPlaceholder01"  # claim "bound": interface = the sandbox's veth
BOUND = ("10.241.0.12", "fd00:241::12")
SANDBOX_UID = 4241
UP4, UP6, DENIED4, DENIED6 = "10.242.0.2", "fd00:242::2", "10.242.0.3", "fd00:242::3"


COUNTERS = """
table inet sgcount {
  counter c_sbx {}
  counter c_denied {}
  counter c_udp {}
  counter c_echo {}
  counter c_dns {}
  chain count {
    type filter hook prerouting priority -400; policy accept;
    ip saddr 10.241.0.0/16 counter name "c_sbx"
    ip6 saddr fd00:241::/32 counter name "c_sbx"
    ip daddr 10.242.0.3 counter name "c_denied"
    ip6 daddr fd00:242::3 counter name "c_denied"
    meta l4proto udp counter name "c_udp"
    ip daddr 10.242.0.2 udp dport 53 counter name "c_dns"
    icmp type echo-request counter name "c_echo"
    icmpv6 type echo-request counter name "c_echo"
  }
}
"""

UDP_PROBE = """
import socket
for host, fam in (("10.242.0.2", socket.AF_INET), ("fd00:242::2", socket.AF_INET6)):
    for port in (443, 53):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        for _ in range(3):
            try:
                s.sendto(b"quic-or-dns?", (host, port))
            except OSError:
                pass
        s.close()
"""


@dataclass
class Fence:
    lab: Lab
    host: str
    sbx: str
    up: str
    host_if: str  # the host's end of the sandbox's veth
    proxy: NsProxy
    tport: int
    secret: str
    record: Path
    ca: Path  # surrogate's CA certificate, readable by the sandbox user
    received: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = sh("nft", "list", "counters", "table", "inet", "sgcount", ns=self.up).stdout
        return {m[0]: int(m[1]) for m in re.findall(r"counter c_(\w+) \{\s*packets (\d+)", out)}

    def reset_counts(self) -> None:
        sh("nft", "delete", "table", "inet", "sgcount", ns=self.up)
        sh("nft", "-f", "-", ns=self.up, input=COUNTERS)

    def run(self, form: str, *cmd: str, timeout: int = 30) -> subprocess.CompletedProcess[str]:
        """``cmd`` as the sandbox: in its namespace, or as its user on the host (--uid)."""
        if form == "uid":
            argv = [
                "ip",
                "netns",
                "exec",
                self.host,
                "setpriv",
                f"--reuid={SANDBOX_UID}",
                f"--regid={SANDBOX_UID}",
                "--clear-groups",
                *cmd,
            ]
        else:
            argv = ["ip", "netns", "exec", self.sbx, *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        self.received.append(done.stdout + done.stderr)
        return done

    def curl(self, form: str, url: str, address: str, *args: str) -> subprocess.CompletedProcess[str]:
        host = url.split("/")[2]
        spelled = f"[{address}]" if ":" in address else address
        return self.run(
            form,
            "curl",
            "-sS",
            "--max-time",
            "10",
            "--cacert",
            str(self.ca),
            "--resolve",
            f"{host}:443:{spelled}",
            "-w",
            "\n%{http_code}",
            *args,
            url,
        )

    def upstream_saw(self, path: str) -> list[list[list[str]]]:
        rows = (
            [json.loads(line) for line in self.record.read_text().splitlines()]
            if self.record.exists()
            else []
        )
        return [r["headers"] for r in rows if r["path"] == path]


@pytest.fixture(scope="module")
def fence(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fence]:
    why = missing("ping", "setpriv")
    if why:
        pytest.skip(why)
    st = Stage(tmp_path_factory.mktemp("fence"))
    st.every_canary = True  # the proxy's audit file and stderr hold no canary of the session
    with st:
        tmp = st.tmp
        secret = st.secret("api", tag="fence", file="secret")
        st.token("unused-in-transparent-mode", newline=False)
        st.ca.ca.private_key_pem.write_to_path(str(tmp / "ca-key.pem"))
        lab = Lab()
        st.defer(lab.teardown)
        host_if, up_if = f"sg-hs-{lab.tag}", f"sg-hu-{lab.tag}"
        both = ["api.test", "api6.test"]
        text = rules(
            [egress("api.test"), egress("api6.test")],
            claims=[
                claim(
                    "sandbox",
                    [credential("api", PH, both, "file:secret")],
                    sources=["10.241.0.2/32", "fd00:241::2/128", "10.242.0.1/32", "fd00:242::1/128"],
                ),
                claim(
                    "bound",
                    [credential("bound-api", PH_BOUND, both, "file:secret")],
                    sources=[f"{BOUND[0]}/32", f"{BOUND[1]}/128"],
                    interface=host_if,
                ),
            ],
        )
        record = canary.exempt(tmp / "upstream.jsonl")
        public_ca = Path(f"/tmp/sg-fence-ca-{lab.tag}.pem")
        st.defer(public_ca.unlink, True)
        host, sbx, up = lab.add("host"), lab.add("sbx"), lab.add("up")
        lab.link(host, host_if, sbx, "eth0")
        lab.link(host, up_if, up, "eth0")
        lab.addr(host, host_if, "10.241.0.1/24", "fd00:241::1/64")
        lab.addr(sbx, "eth0", "10.241.0.2/24", "fd00:241::2/64")
        lab.addr(host, up_if, "10.242.0.1/24", "fd00:242::1/64")
        lab.addr(up, "eth0", f"{UP4}/24", f"{UP6}/64", f"{DENIED4}/24", f"{DENIED6}/64")
        for ns, v4, v6 in ((sbx, "10.241.0.1", "fd00:241::1"), (up, "10.242.0.1", "fd00:242::1")):
            lab.route(ns, "default", "via", v4)
            lab.route(ns, "default", "via", v6)
        lab.forwarding(host)
        sh("nft", "-f", "-", ns=up, input=COUNTERS)
        key = tmp / "ca-key.pem"
        st.process(
            upstream_argv(up, st.ca.ca_pem, key, ["api.test", "api6.test", "denied.test"], [UP4, UP6], record)
        )
        tport = free_port()
        transparent = ["--transparent", f"[::]:{tport}"]
        pins = {"api.test": UP4, "api6.test": UP6}
        proxy = st.proxy(text, pins, cls=partial(NsProxy, host), args=transparent)
        # the --uid sandbox user cannot enter pytest's 0700 temp dir: a readable copy of the CA
        shutil.copyfile(proxy.ca_pem, public_ca)
        public_ca.chmod(0o644)
        yield Fence(lab, host, sbx, up, host_if, proxy, tport, secret, record, public_ca)


def printed(fence: Fence, form: str, *extra: str) -> str:
    args = {
        "interface": ["--interface", fence.host_if],
        "source": ["--source", "10.241.0.2/32", "--source", "fd00:241::2/128", "--unsafe-source-only"],
        "uid": ["--uid", str(SANDBOX_UID), "--proxy-uid", "0"],
    }[form]
    # in-process (tests/inprocess.py): the same text; the command as a process is
    # tests/e2e/test_fence_revocation.py's
    return in_process("transparent-rules", "--port", str(fence.tport), *args, *extra, check=True).stdout


def test_without_the_fence_the_probes_do_arrive(fence: Fence) -> None:
    """The counting works: with no rules loaded, the sandbox's ping and UDP reach the upstream."""
    flush_rules(fence.host)
    fence.reset_counts()
    fence.run("sbx", "ping", "-c1", "-W2", UP4)
    fence.run("sbx", "ping", "-6", "-c1", "-W2", UP6)
    fence.run("sbx", "python3", "-c", UDP_PROBE)
    time.sleep(0.3)
    counts = fence.counts()
    assert counts["echo"] >= 2 and counts["udp"] >= 12 and counts["sbx"] >= 14, counts


CASES = [(form, tool) for form in ("interface", "source", "uid") for tool in ("iptables", "nft")]


@pytest.mark.parametrize(("form", "tool"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_the_printed_fence_leaves_the_sandbox_only_the_proxy(fence: Fence, form: str, tool: str) -> None:
    flush_rules(fence.host)
    fence.reset_counts()
    load_printed(printed(fence, form), fence.host, tool)
    tag = f"{form}-{tool}"
    # IPv4 and IPv6 TCP to an allowed host go through the proxy, the placeholder swapped
    for family, name, address, source in (
        ("v4", "api.test", UP4, "10.241.0.2"),
        ("v6", "api6.test", UP6, "fd00:241::2"),
    ):
        path = f"/fence/{tag}/{family}"
        bind = ["--interface", source] if form != "uid" else []  # not the bound claim's address
        done = fence.curl(form, f"https://{name}{path}", address, *bind, "-H", f"Authorization: Bearer {PH}")
        assert done.stdout.endswith("200"), (family, done)
        event = fence.proxy.wait_event(path=path)
        assert (event["claim"], event["decision"], event["host"]) == ("sandbox", "allow", name)
        assert event["credentials"] == [{"name": "api", "version": 1}]
        deadline = time.monotonic() + 5
        while not fence.upstream_saw(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        auth = [v for h in fence.upstream_saw(path) for k, v in h if k.lower() == "authorization"]
        assert auth == [f"Bearer {fence.secret}"], family  # swapped, never the placeholder
    if form == "interface":  # the printed mark: a claim bound to this veth is served here
        fence.lab.addr(fence.sbx, "eth0", f"{BOUND[0]}/24", f"{BOUND[1]}/64")
        for family, name, address, source in (
            ("v4", "api.test", UP4, BOUND[0]),
            ("v6", "api6.test", UP6, BOUND[1]),
        ):
            path = f"/fence/{tag}/bound-{family}"
            done = fence.curl(form, f"https://{name}{path}", address, "--interface", source,
                              "-H", f"Authorization: Bearer {PH_BOUND}")  # fmt: skip
            assert done.stdout.endswith("200"), (family, done)
            event = fence.proxy.wait_event(path=path)
            assert (event["claim"], event["credentials"]) == ("bound", [{"name": "bound-api", "version": 1}])
        for cidr in (f"{BOUND[0]}/24", f"{BOUND[1]}/64"):
            sh("ip", "addr", "del", cidr, "dev", "eth0", ns=fence.sbx)
    # IPv6 (and IPv4) TCP to a host no rule allows: refused by the proxy, nothing arrives there
    for family, address in (("v6", DENIED6), ("v4", DENIED4)):
        done = fence.curl(form, f"https://denied.test/fence/{tag}/denied-{family}", address)
        assert done.stdout.endswith("403") and "no_rule" in done.stdout, (family, done)
    # UDP on 443 (QUIC) and 53 (DNS) and ICMP, both families: dropped
    fence.run(form, "python3", "-c", UDP_PROBE)
    assert fence.run(form, "ping", "-c1", "-W1", UP4).returncode != 0
    assert fence.run(form, "ping", "-6", "-c1", "-W1", UP6).returncode != 0
    time.sleep(0.3)
    counts = fence.counts()
    assert counts == {"sbx": 0, "denied": 0, "udp": 0, "echo": 0, "dns": 0}, counts


@pytest.mark.parametrize("tool", ["iptables", "nft"])
def test_a_named_resolver_is_the_only_udp_that_leaves(fence: Fence, tool: str) -> None:
    """--resolver 10.242.0.2: DNS to it passes (UDP 53 only); QUIC to it and everything else
    stays dropped."""
    flush_rules(fence.host)
    fence.reset_counts()
    load_printed(printed(fence, "interface", "--resolver", UP4), fence.host, tool)
    fence.run("interface", "python3", "-c", UDP_PROBE)
    time.sleep(0.3)
    counts = fence.counts()
    assert counts["dns"] == 3 and counts["udp"] == 3 and counts["echo"] == 0, counts


@pytest.mark.parametrize("tool", ["iptables", "nft"])
def test_without_an_ipv6_listener_all_ipv6_is_dropped(fence: Fence, tool: str) -> None:
    flush_rules(fence.host)
    fence.reset_counts()
    load_printed(printed(fence, "interface", "--no-ipv6"), fence.host, tool)
    done = fence.curl("interface", "https://api6.test/fence/no-ipv6", UP6, "--max-time", "3")
    assert not done.stdout.endswith("200"), done
    ok = fence.curl("interface", "https://api.test/fence/no-ipv6-v4", UP4)
    assert ok.stdout.endswith("200"), ok
    fence.run("interface", "python3", "-c", UDP_PROBE)
    time.sleep(0.3)
    assert fence.counts() == {"sbx": 0, "denied": 0, "udp": 0, "echo": 0, "dns": 0}
    assert [e for e in fence.proxy.audit_events() if e.get("path") == "/fence/no-ipv6"] == []


@pytest.mark.parametrize("tool", ["iptables", "nft"])
def test_the_interface_anti_spoof_rule_drops_another_source(fence: Fence, tool: str) -> None:
    """--interface IF --source CIDR: what arrives on IF from an address outside CIDR is dropped
    before NAT: the sandbox cannot pose as any other address, claimed or not."""
    flush_rules(fence.host)
    fence.reset_counts()
    rules = printed(fence, "interface", "--source", "10.241.0.2/32", "--source", "fd00:241::2/128")
    load_printed(rules, fence.host, tool)
    fence.lab.addr(fence.sbx, "eth0", "10.241.0.99/24", "fd00:241::99/64")
    try:
        for family, name, address, source in (
            ("v4", "api.test", UP4, "10.241.0.99"),
            ("v6", "api6.test", UP6, "fd00:241::99"),
        ):
            path = f"/fence/{tool}/spoofed-{family}"
            done = fence.curl(
                "interface", f"https://{name}{path}", address, "--interface", source, "--max-time", "3"
            )
            assert not done.stdout.endswith("200"), done
            assert [e for e in fence.proxy.audit_events() if e.get("path") == path] == []
        ok = fence.curl("interface", "https://api.test/fence/own-source", UP4, "--interface", "10.241.0.2")
        assert ok.stdout.endswith("200"), ok
    finally:
        for cidr in ("10.241.0.99/24", "fd00:241::99/64"):
            sh("ip", "addr", "del", cidr, "dev", "eth0", ns=fence.sbx, check=False)
    assert fence.counts()["sbx"] == 0


def test_nft_uid_rules_load_on_this_nft(fence: Fence) -> None:
    """Regression: the --uid nft rules said ``priority dstnat`` in an output chain, which
    nftables 1.0.6 (Debian 12) refuses ("invalid priority expression value in this context")."""
    flush_rules(fence.host)
    load_printed(printed(fence, "uid"), fence.host, "nft")
    listed = sh("nft", "list", "table", "inet", "surrogate", ns=fence.host).stdout
    assert "hook output priority -100" in listed or "hook output priority dstnat" in listed


def test_zz_no_client_saw_the_secret(fence: Fence) -> None:
    canary.assert_absent({"fence clients": "".join(fence.received).encode()})


VARIANTS = {
    "interface": ["--interface", "sg-any0"],
    "interface-sources": [
        "--interface",
        "sg-any0",
        "--source",
        "10.241.9.2/32",
        "--source",
        "fd00:241:9::2/128",
    ],
    "interface-resolvers-no-ipv6": ["--interface", "sg-any0", "--resolver", "10.241.9.53", "--no-ipv6"],
    "source-both": [
        "--source",
        "10.241.9.0/24",
        "--source",
        "fd00:241:9::/64",
        "--resolver",
        "fd00:241:9::53",
        "--unsafe-source-only",
    ],
    "source-v4-no-ipv6": ["--source", "10.241.9.0/24", "--no-ipv6", "--unsafe-source-only"],
    "uid": ["--uid", "4242", "--proxy-uid", "4243", "--resolver", "127.0.0.53", "--resolver", "::1"],
    "uid-no-ipv6": ["--uid", "4242", "--proxy-uid", "4243", "--no-ipv6"],
    "bridge-port": ["--bridge-port", "sg-any1", "--source", "10.241.9.2/32", "--source", "fd00:241:9::2/128"],
    "bridge-port-v4": ["--bridge-port", "sg-any1", "--source", "10.241.9.2/32"],
}


@pytest.mark.parametrize("tool", ["iptables", "nft"])
@pytest.mark.parametrize("variant", VARIANTS, ids=list(VARIANTS))
def test_every_printed_variant_loads_on_this_machines_tools(fence: Fence, variant: str, tool: str) -> None:
    """Each option combination's rules load as printed (iptables, ip6tables, ebtables, nft), and
    loading them twice (a second sandbox) merges instead of failing."""
    ns = fence.lab.add(f"ld{len(fence.lab.spaces)}")
    out = in_process("transparent-rules", "--port", "8081", *VARIANTS[variant], check=True).stdout
    load_printed(out, ns, tool)
    if tool == "nft":
        load_printed(out, ns, tool)
    listed = sh("nft", "list", "ruleset", ns=ns).stdout
    assert ("redirect" in listed or "REDIRECT" in listed or "bridge" in listed) and "drop" in listed.lower()
