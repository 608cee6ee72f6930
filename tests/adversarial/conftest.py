"""The adversarial suite: a hostile sandbox (and hostile upstreams) against a running proxy.

One module per threat class of issue 5; docs/threat-model.md maps each threat to its defence and
to the tests here. Every test in this folder is marked ``e2e``. The ``world`` fixture (one per
module) is a real proxy process with two claims in front of a real HTTPS upstream on loopback:

- ``agent`` (pool ``p``): GET /v1* on api.test, anything on other.test and mismatch.test (whose
  name the upstream's certificate does not cover), plain http:// to plain.test on any port, a
  catch-all opaque ``*`` rule on the upstream's port; credential ``api`` (a canary) bound to api.test and
  mismatch.test;
- ``wide`` (pool ``w``): every host and port, intercepted, https and plain http, with wildcard
  and IDNA rules, so that what refuses a request is the resolver's address check or name
  matching, not a missing rule. Same proxy token as ``agent``.
"""

from __future__ import annotations

import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path

import canary
import pytest
from harness import ProxyProcess, World
from servers import TestCA, Upstream

PH = "surr_HostileTestPlaceholder001"
WIDE_PH = "surr_HostileWidePlaceholder002"
# names the upstream's certificate covers, all pinned to 127.0.0.1 with --resolve
NAMES = [
    "api.test",
    "other.test",
    "evil.test",
    "a.wild.test",
    "wild.test",
    "badwild.test",
    "xn--bcher-kva.test",
    "plain.test",
]
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def rules_text(port: int) -> str:
    return textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            egress:
              - host: api.test
                ports: [{port}]
                methods: [GET]
                paths: ["/v1"]
              - host: other.test
                ports: [{port}]
              - host: plain.test
                ports: []
                scheme: http
              - host: mismatch.test
                ports: [{port}]
              # a catch-all opaque rule after the intercepting one: it must never approve a
              # request inside an intercepted tunnel
              - host: "*"
                ports: [{port}]
                intercept: false
            unsafe_any_host: true
          w:
            egress:
              - host: "*.wild.test"
                ports: [{port}]
              - host: "bücher.test"
                ports: [{port}]
              - host: "*"
                ports: []
              - host: "*"
                ports: []
                scheme: http
            unsafe_any_host: true
        claims:
          - id: agent
            pool: p
            proxy_token: file:token
            credentials:
              - name: api
                value: file:secret
                placeholder: {PH}
                hosts: [api.test, mismatch.test]
          - id: wide
            pool: w
            proxy_token: file:token
            credentials:
              - name: wild
                value: file:secret
                placeholder: {WIDE_PH}
                hosts: ["*.wild.test", "bücher.test"]
        """)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("hostile")
    secret, token = canary.make("hostile"), "agent-token-" + secrets.token_hex(8)
    canary.source(tmp / "secret", secret)
    (tmp / "token").write_text(token)
    ca = TestCA(tmp)
    upstream = Upstream(ca, NAMES, tmpdir=tmp).start()
    rules = tmp / "rules.yaml"
    rules.write_text(rules_text(upstream.port))
    # mismatch.test is pinned too, but the upstream's certificate does not cover it
    pins = {n: "127.0.0.1" for n in [*NAMES, "mismatch.test"]}
    proxy = ProxyProcess(rules, tmp, upstream_ca=ca.ca_pem, resolve=pins)
    w = World(upstream, proxy, token, secret, PH)
    try:
        proxy.start()
        yield w
    finally:
        proxy.stop()
        upstream.stop()
    canary.assert_absent(
        {
            "client-received bytes": b"".join(w.received),
            "audit file": proxy.audit_path.read_bytes() if proxy.audit_path.exists() else b"",
            "proxy stderr": proxy.stderr_path.read_bytes(),
        },
        [secret],
    )
