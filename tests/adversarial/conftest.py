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
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import World
from world import Stage, claim, credential, egress, rules

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
    return rules(
        pools={
            "p": {
                "egress": [
                    egress("api.test", port, methods=["GET"], paths=["/v1"]),
                    egress("other.test", port),
                    egress("plain.test", ports=[], scheme="http"),
                    egress("mismatch.test", port),
                    # a catch-all opaque rule after the intercepting one: it must never approve a
                    # request inside an intercepted tunnel
                    egress("*", port, intercept=False),
                ],
                "unsafe_any_host": True,
            },
            "w": {
                "egress": [
                    egress("*.wild.test", port),
                    egress("bücher.test", port),
                    egress("*", ports=[]),
                    egress("*", ports=[], scheme="http"),
                ],
                "unsafe_any_host": True,
            },
        },
        claims=[
            claim("agent", [credential("api", PH, ["api.test", "mismatch.test"], "file:secret")]),
            claim(
                "wide",
                [credential("wild", WIDE_PH, ["*.wild.test", "bücher.test"], "file:secret")],
                pool="w",
            ),
        ],
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("hostile")) as st:
        secret = st.secret(tag="hostile", file="secret")
        token = st.token("agent-token-" + secrets.token_hex(8), newline=False)
        upstream = st.upstream(NAMES)
        # mismatch.test is pinned too, but the upstream's certificate does not cover it
        proxy = st.proxy(rules_text(upstream.port), [*NAMES, "mismatch.test"])
        yield World(upstream, proxy, token, secret, PH, st.received)
