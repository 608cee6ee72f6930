"""Placeholder smuggling: odd spellings cannot carry a placeholder past the violation check
toward a host its credential is not bound to. Defence: proxy/substitute.py ``substitute_request``
(lenient Basic decoding, percent-decoded request target). Forged placeholders (checksums) are the
other helper's tests/adversarial/test_placeholder_forgery.py."""

from __future__ import annotations

import base64

import pytest
from harness import World

PH = "surr_HostileTestPlaceholder001"


@pytest.mark.parametrize(
    "header",
    [
        "Basic\t" + base64.b64encode(f"x:{PH}".encode()).decode(),
        "Basic " + base64.b64encode(f"xx:{PH}".encode()).decode().rstrip("="),
        "Basic "
        + " ".join(base64.b64encode(f"x:{PH}".encode()).decode()[i : i + 8] for i in range(0, 44, 8)),
        "basic " + base64.b64encode(f"x:{PH}".encode()).decode(),
    ],
    ids=["tab-separator", "no-padding", "spaces-inside", "lower-case-scheme"],
)
def test_odd_basic_spellings_still_count_as_a_placeholder(world: World, header: str) -> None:
    before = world.upstream.connections
    done = world.curl("--http1.1", "-H", f"Authorization: {header}", world.url("/odd-basic", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/odd-basic") == [] and world.upstream.connections == before


@pytest.mark.parametrize(
    "query",
    [PH.replace("_", "%5F"), PH.replace("_", "%5f"), "".join(f"%{b:02X}" for b in PH.encode()), PH],
    ids=["underscore-encoded", "lower-hex", "every-byte-encoded", "plain"],
)
def test_a_placeholder_in_the_query_toward_an_unbound_host_is_a_violation(world: World, query: str) -> None:
    before = world.upstream.connections
    done = world.curl(world.url(f"/q?key={query}", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/q") == [] and world.upstream.connections == before


def test_a_placeholder_in_any_header_toward_an_unbound_host_is_a_violation(world: World) -> None:
    before = world.upstream.connections
    done = world.curl("-H", f"X-Anything: prefix-{PH}-suffix", world.url("/any-header", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/any-header") == [] and world.upstream.connections == before
