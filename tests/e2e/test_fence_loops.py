"""The proxy never talks to itself, whatever the addresses (issue 21, issue 20 item 7).

Each test builds a "host" network namespace (``sg-*``) with addresses of both families on a dummy
interface and runs the proxy inside it, so the root namespace's rules are never touched.

- ``--listen 0.0.0.0:P`` (and ``[::]:P``) accepts on every address of the host: a request to any
  of them on P is refused once (403 ``own_listener``), an address added after start included.
- A redirect rule without the exclusion of the proxy's own traffic, on a host where the sandbox
  shares the proxy's address (so the looped connection comes from a claim's address): one request
  is refused once (``own_listener``), not a chain of dozens of allowed ones.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from _netns import Lab, NsProxy, missing, sh
from harness import free_port
from world import Stage, claim, egress, rules

pytestmark = pytest.mark.e2e


@pytest.fixture
def lab() -> Iterator[Lab]:
    why = missing()
    if why:
        pytest.skip(why)
    made = Lab()
    try:
        yield made
    finally:
        made.teardown()


def host_ns(lab: Lab, v4: str, v6: str) -> str:
    host = lab.add("host")
    # a veth pair with both ends here (no dummy driver on every kernel): sg-d0 holds the addresses
    sh("ip", "link", "add", "sg-d0", "type", "veth", "peer", "name", "sg-d1", ns=host)
    sh("ip", "link", "set", "sg-d0", "up", ns=host)
    sh("ip", "link", "set", "sg-d1", "up", ns=host)
    lab.addr(host, "sg-d0", v4, v6)
    return host


def curl(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return sh(
        "curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}", *args, ns=ns, check=False, timeout=40
    )


@pytest.mark.parametrize("listen", ["0.0.0.0", "::"])
def test_a_request_to_any_host_address_on_the_listeners_port_is_refused_once(
    lab: Lab, tmp_path: Path, listen: str
) -> None:
    host = host_ns(lab, "10.243.0.1/24", "fd00:243::1/64")
    with Stage(tmp_path) as st:
        st.token("own-listener-token", newline=False)
        proxy = st.proxy(st.write(""), upstream_ca=None, cls=partial(NsProxy, host), start=False)
        cidrs = ["10.243.0.0/16", "fd00:243::/32", "127.0.0.0/8", "::1/128"]
        # the plain-HTTP requests below: allowed, so only own_listener refuses
        every = [egress("*", proxy.port), egress("*", proxy.port, scheme="http")]
        proxy.rules.write_text(rules(every, pool_extra={"allow_cidrs": cidrs}, claims=[claim("agent")]))
        at = proxy.args.index("--listen")
        spelled = f"[{listen}]" if ":" in listen else listen
        proxy.args[at + 1] = f"{spelled}:{proxy.port}"
        proxy.start()
        sh("ip", "addr", "add", "10.243.0.7/24", "dev", "sg-d0", ns=host)  # after start: still the host's
        sh("ip", "addr", "add", "fd00:243::7/64", "dev", "sg-d0", "nodad", ns=host)
        port = proxy.port
        via = f"http://agent:own-listener-token@127.0.0.1:{port}"
        addresses = ["10.243.0.1", "10.243.0.7", "fd00:243::1", "fd00:243::7", "127.0.0.1", "::1"]
        for i, address in enumerate(addresses):
            spelled = f"[{address}]" if ":" in address else address
            done = curl(host, "-x", via, f"http://{spelled}:{port}/own/{i}")
            assert done.stdout.endswith("403") and "own_listener" in done.stdout, (address, done)
        time.sleep(0.5)
        for i, address in enumerate(addresses):
            events = [e for e in proxy.audit_events() if e.get("path") == f"/own/{i}"]
            assert [e["reason"] for e in events] == ["own_listener"], (address, events)


RULES_LOOP = rules(
    [egress("api.test", 80), egress("api6.test", 80)],
    pool_extra={"limits": {"connections": 32}},
    claims=[claim("sandbox", sources=["10.244.0.1/32", "fd00:244::1/128"])],
)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("family", "name", "upstream"), [("v4", "api.test", "10.244.0.2"), ("v6", "api6.test", "fd00:244::2")]
)
def test_a_redirect_without_the_exclusion_is_refused_once_when_the_sandbox_shares_the_address(
    lab: Lab, tmp_path: Path, family: str, name: str, upstream: str, workers: int
) -> None:
    """The sandbox is a process on the proxy's host (same address, a claim's source); the redirect
    rule catches every user's connections to the upstream, the proxy's own included. Before the
    fix, plain HTTP looped up to the claim's connection limit, each nested request allowed."""
    host = host_ns(lab, "10.244.0.1/24", "fd00:244::1/64")
    with Stage(tmp_path) as st:
        st.token("unused", newline=False)
        tport = free_port()
        proxy = st.proxy(
            RULES_LOOP,
            {"api.test": "10.244.0.2", "api6.test": "fd00:244::2"},
            upstream_ca=None,
            cls=partial(NsProxy, host),
            workers=workers,  # 2: the looped connection may land on the other worker
            args=["--transparent", f"[::]:{tport}"],
        )
        cmd = "iptables" if family == "v4" else "ip6tables"
        redirect = ["-d", upstream, "-p", "tcp", "--dport", "80", "-j", "REDIRECT", "--to-ports", str(tport)]
        sh(cmd, "-t", "nat", "-A", "OUTPUT", *redirect, ns=host)
        spelled = f"[{upstream}]" if ":" in upstream else upstream
        curl(host, "--resolve", f"{name}:80:{spelled}", f"http://{name}/loop")
        time.sleep(1.0)
        events = [e for e in proxy.audit_events() if e.get("path") == "/loop"]
        refused = [e for e in events if e["decision"] != "allow"]
        assert [e["reason"] for e in refused] == ["own_listener"], events
        assert len(events) <= 2, events  # the outer request (answered with the refusal) and the refused one
        done = curl(host, "--resolve", f"{name}:80:{spelled}", f"http://{name}/again")
        assert done.stdout.endswith("403") and "own_listener" in done.stdout, done


RULES_OPAQUE_LOOP = rules(
    [egress("api.test", intercept=False)],
    pool_extra={"limits": {"connections": 32}},
    claims=[claim("sandbox", sources=["10.244.0.1/32"])],
)


def test_a_looped_tls_connection_is_never_passed_through_again(lab: Lab, tmp_path: Path) -> None:
    """The same loop on an opaque (pass-through) rule: the looped connection is intercepted, not
    passed on, and its request refused once; before, each pass-through opened the next."""
    host = host_ns(lab, "10.244.0.1/24", "fd00:244::1/64")
    with Stage(tmp_path) as st:
        st.token("unused", newline=False)
        tport = free_port()
        proxy = st.proxy(
            RULES_OPAQUE_LOOP,
            {"api.test": "10.244.0.2"},
            upstream_ca=None,
            cls=partial(NsProxy, host),
            args=["--transparent", f"[::]:{tport}"],
        )
        rule = ["-d", "10.244.0.2", "-p", "tcp", "--dport", "443", "-j", "REDIRECT", "--to-ports", str(tport)]
        sh("iptables", "-t", "nat", "-A", "OUTPUT", *rule, ns=host)
        done = curl(
            host,
            "--cacert",
            str(proxy.ca_pem),
            "--resolve",
            "api.test:443:10.244.0.2",
            "https://api.test/tls-loop",
        )
        assert done.stdout.endswith("403") and "own_listener" in done.stdout, done
        time.sleep(1.0)
        events = proxy.audit_events()
        refused = [e for e in events if e["decision"] != "allow"]
        assert [(e["path"], e["reason"]) for e in refused] == [("/tls-loop", "own_listener")], events
        assert len([e for e in events if e["event"] == "tunnel"]) <= 1, events
