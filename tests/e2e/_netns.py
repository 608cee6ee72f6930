"""Network namespaces for the fence tests: every name starts ``sg-``, every address is in
10.241.0.0/16–10.249.0.0/16 or fd00:241::/32-style ranges, and everything made is deleted by
:meth:`Lab.teardown` (deleting a namespace deletes its veths, rules and sysctls with it). The
proxy runs inside a "host" namespace of its own, so no rule is ever loaded in the root namespace.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import ProxyProcess


def missing(*tools: str) -> str | None:
    """Why these tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "fence tests need root (network namespaces, iptables, nft)"
    for tool in ("ip", "iptables", "ip6tables", "nft", "curl", *tools):
        if shutil.which(tool) is None:
            return f"fence tests need {tool!r} (apt-get install iproute2 iptables nftables curl iputils-ping)"
    probe_ns = f"sg-probe-{os.getpid()}"  # one per process: xdist workers probe at once
    probe = subprocess.run(["ip", "netns", "add", probe_ns], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe_ns], check=False)
    return None


def sh(
    *cmd: str, ns: str | None = None, check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    full = ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)
    done = subprocess.run(full, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if check and done.returncode != 0:
        raise RuntimeError(f"{shlex.join(full)} exited {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass
class Lab:
    """Namespaces joined by veth pairs; ``ns(role)`` is a namespace's name."""

    tag: str = field(default_factory=lambda: secrets.token_hex(4))  # "sg-hs-" + 8: 14 chars
    spaces: list[str] = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"sg-{role}-{self.tag}"

    def add(self, role: str) -> str:
        name = self.ns(role)
        sh("ip", "netns", "add", name)
        self.spaces.append(name)
        sh("ip", "link", "set", "lo", "up", ns=name)
        return name

    def link(self, a: str, a_if: str, b: str, b_if: str) -> None:
        """A veth pair: ``a_if`` in namespace ``a``, ``b_if`` in ``b`` (names ≤ 15 chars)."""
        sh("ip", "link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b)
        sh("ip", "link", "set", a_if, "up", ns=a)
        sh("ip", "link", "set", b_if, "up", ns=b)

    def addr(self, ns: str, dev: str, *cidrs: str) -> None:
        for cidr in cidrs:
            extra = ["nodad"] if ":" in cidr else []
            sh("ip", "addr", "add", cidr, "dev", dev, *extra, ns=ns)

    def route(self, ns: str, *args: str) -> None:
        sh("ip", *(["-6"] if ":" in args[-1] else []), "route", "add", *args, ns=ns)

    def forwarding(self, ns: str) -> None:
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", ns=ns)

    def routed(
        self, sbx_net: str, up_net: str, hs: str, hu: str, roles: tuple[str, str, str] = ("h", "s", "u")
    ) -> tuple[str, str, str]:
        """Host, sandbox and upstream namespaces (``roles``): the sandbox is ``.2`` of
        ``sbx_net``.0/24 behind the host's ``hs`` (``.1``), the upstream ``.2`` of ``up_net``.0/24
        behind its ``hu``; both route via the host, which forwards. Returns the three names."""
        host, sbx, up = (self.add(r) for r in roles)
        for ns, dev, net in ((sbx, hs, sbx_net), (up, hu, up_net)):
            self.link(host, dev, ns, "eth0")
            self.addr(host, dev, f"{net}.1/24")
            self.addr(ns, "eth0", f"{net}.2/24")
            self.route(ns, "default", "via", f"{net}.1")
        self.forwarding(host)
        return host, sbx, up

    def teardown(self) -> None:
        for name in reversed(self.spaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self.spaces.clear()


def load_printed(text: str, ns: str, tool: str) -> None:
    """Load the printed rules into namespace ``ns`` exactly as printed: for ``tool`` "iptables",
    every iptables/ip6tables/ebtables/sysctl command line; for "nft", the ``nft -f`` part (and the
    sysctl lines)."""
    lines = text.splitlines()
    commands = [
        line for line in lines if line.split(" ", 1)[0] in ("iptables", "ip6tables", "ebtables", "sysctl")
    ]
    if tool == "nft":
        start = next(i for i, line in enumerate(lines) if line.startswith("table "))
        sh("nft", "-f", "-", ns=ns, input="\n".join(lines[start:]) + "\n")
        commands = [c for c in commands if c.startswith("sysctl ")]
    for command in commands:
        sh(*shlex.split(command), ns=ns)


def flush_rules(ns: str) -> None:
    """Empty every table of ``ns`` (iptables-nft and nft share the kernel's nf_tables)."""
    sh("nft", "flush", "ruleset", ns=ns)


class NsProxy(ProxyProcess):
    """The proxy, run inside namespace ``ns`` (the harness's own start probes the root one)."""

    def __init__(self, ns: str, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.ns = ns
        self.args = ["ip", "netns", "exec", ns, *self.args]

    def start(self, timeout: float = 30.0) -> NsProxy:
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.args,
                cwd=Path(__file__).resolve().parents[2],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + timeout
        probe = f"exec 3<>/dev/tcp/127.0.0.1/{self.port}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}: {self.stderr()}")
            if sh("bash", "-c", probe, ns=self.ns, check=False).returncode == 0:
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"proxy did not listen within {timeout}s: {self.stderr()}")


_UPSTREAM = """
import json, pathlib, sys, threading, time
sys.path.insert(0, {tests!r})
import trustme
from servers import TestCA, Upstream
class CA(TestCA):
    def __init__(self): pass
ca = CA()
ca.ca = trustme.CA.from_pem(pathlib.Path({cert!r}).read_bytes(), pathlib.Path({key!r}).read_bytes())
ups = [Upstream(ca, {names!r}, bind=(a, 443)).start() for a in {binds!r}]
print("ready", flush=True)
def dump():
    while True:
        rows = [{{"path": r.path, "headers": r.headers}} for u in ups for r in list(u.requests)]
        pathlib.Path({record!r}).write_text("".join(json.dumps(r) + "\\n" for r in rows))
        time.sleep(0.1)
threading.Thread(target=dump, daemon=True).start()
sys.stdin.read()
for u in ups:
    u.stop()
"""


def upstream_argv(
    ns: str, ca: Path, key: Path, names: list[str], binds: list[str], record: Path
) -> list[str]:
    """The command of an HTTPS upstream (tests/servers.py ``Upstream``) inside ``ns``, on port 443
    of each of ``binds``, its certificate for ``names`` from the CA ``ca``/``key``; it prints
    "ready", writes each request's path and headers to ``record`` (JSON lines, every 0.1 s) and
    stops when its stdin closes: run it with world.Stage.process."""
    tests = str(Path(__file__).resolve().parents[1])
    script = _UPSTREAM.format(
        tests=tests, cert=str(ca), key=str(key), names=names, binds=binds, record=str(record)
    )
    return ["ip", "netns", "exec", ns, sys.executable, "-c", script]
