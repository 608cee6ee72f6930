"""Upstream failures that need a network of their own (issue 18): a connection that times out
and an address nobody answers for, each answered with surrogate's JSON refusal and its RFC 9209
Proxy-Status type. The proxy and curl run in a namespace of this test's ("sg-host-…") whose
``tcp_syn_retries`` is 1 (a connect gives up after about 3 s, not 2 minutes); a veth leads to a
second namespace ("sg-void-…") that holds 10.245.9.2 and drops every TCP segment sent to it, and
10.245.10.0/24 has an ``unreachable`` route (EHOSTUNREACH). Nothing leaves the namespaces.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import http_sf
import pytest
from _netns import Lab, NsProxy, missing, sh
from world import Stage, claim, egress, rules

pytestmark = pytest.mark.e2e

DROPPED, NOBODY = "10.245.9.2", "10.245.10.3"


@dataclass
class Net:
    lab: Lab
    proxy: NsProxy
    token: str


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    why = missing()
    if why is not None:
        pytest.skip(why)
    with Stage(tmp_path_factory.mktemp("refusals-netns")) as st:
        token = st.token(secrets.token_hex(8), newline=False)
        text = rules([egress("dropped.test"), egress("nobody.test")], claims=[claim("agent")])
        lab = Lab()
        st.defer(lab.teardown)
        host, void = lab.add("host"), lab.add("void")
        lab.link(host, "sg-h0", void, "sg-v0")
        lab.addr(host, "sg-h0", "10.245.9.1/24")
        lab.addr(void, "sg-v0", f"{DROPPED}/24")
        sh("iptables", "-A", "INPUT", "-p", "tcp", "-j", "DROP", ns=void)
        sh("sysctl", "-qw", "net.ipv4.tcp_syn_retries=1", ns=host)
        sh("ip", "route", "add", "unreachable", "10.245.10.0/24", ns=host)
        pins = {"dropped.test": DROPPED, "nobody.test": NOBODY}  # the operator's: not checked
        proxy = st.proxy(text, pins, upstream_ca=None, cls=partial(NsProxy, host))
        yield Net(lab, proxy, token)


def _curl(net: Net, url: str) -> tuple[list[str], bytes]:
    done = sh(
        "curl", "-sS", "-v", "--http1.1", "--max-time", "60", "-x", net.proxy.url("agent", net.token),
        "--cacert", str(net.proxy.ca_pem), url,
        ns=net.lab.ns("host"), check=False, timeout=90,
    )  # fmt: skip
    heads = [ln[2:] for ln in done.stderr.splitlines() if ln.startswith("< ")]
    return heads, done.stdout.encode()


@pytest.mark.parametrize(
    ("host", "kind", "sentence"),
    [
        ("dropped.test", "connection_timeout", "timed out"),
        ("nobody.test", "destination_ip_unroutable", "cannot be reached"),
    ],
    ids=["timeout", "unroutable"],
)
def test_a_connect_that_fails_in_the_network_is_surrogates_json(
    net: Net, host: str, kind: str, sentence: str
) -> None:
    heads, body_bytes = _curl(net, f"https://{host}/x")
    assert [h for h in heads if h.startswith("HTTP/")][-1].startswith(
        "HTTP/1.1 502 Bad Gateway (upstream_error)"
    ), heads
    assert not any("mitmproxy" in h.lower() for h in heads), heads
    body = json.loads(body_bytes)
    assert body["error"] == "upstream_error" and sentence in body["message"], body
    value = next(h.split(":", 1)[1].strip() for h in heads if h.lower().startswith("proxy-status:"))
    [(name, params)] = http_sf.parse(value.encode(), tltype="list")  # type: ignore[misc]
    assert (str(name), str(params["error"])) == ("surrogate", kind), value
    event = net.proxy.wait_event(request_id=body["request_id"])
    assert (event["reason"], event["status"]) == ("upstream_error", 502)
