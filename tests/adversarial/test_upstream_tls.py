"""Unverified upstream TLS: a secret leaves only over TLS that surrogate verified (invariant 2).

Defence: proxy/engine/master.py ``build_master`` (``ssl_insecure`` off, upstream verified against the
system roots plus ``--upstream-ca``), and substitution happening in the request that only goes out
on a verified connection. A hostile upstream here presents either a certificate from a CA the
proxy does not trust, or a trusted certificate for another name.
"""

from __future__ import annotations

import ssl

import httpx
from harness import World
from world import Stage


def test_an_upstream_from_an_untrusted_ca_gets_no_request_and_no_secret(world: World) -> None:
    """The same rules and upstream, but a proxy that was not told to trust the upstream's CA."""
    (world.proxy.workdir / "untrusting").mkdir()
    with Stage(world.proxy.workdir / "untrusting") as st:
        st.watch(world.secret)  # not in the untrusting proxy's audit file or stderr either
        untrusting = st.proxy(world.proxy.rules, ["api.test"], upstream_ca=None)
        ctx = ssl.create_default_context(cafile=untrusting.ca_pem)
        with httpx.Client(proxy=untrusting.url("agent", world.token), verify=ctx) as client:
            r = client.get(world.url("/v1/unverified"), headers={"X-Api-Key": world.placeholder})
        world.received.append(r.content)
        assert r.status_code == 502
        event = untrusting.wait_event(path="/v1/unverified")
        assert (event["decision"], event["reason"], event["status"]) == ("error", "upstream_error", 502)
        assert event["credentials"] == []  # the TLS handshake failed: no secret left the proxy
        assert "certificate" in event["message"].lower()
    assert world.paths("/v1/unverified") == []


def test_a_certificate_for_another_name_gets_no_request_and_no_secret(world: World) -> None:
    """mismatch.test is bound to the credential and pinned to the upstream, whose certificate
    (from a trusted CA) does not name it."""
    done = world.curl(
        "-H", f"Authorization: Bearer {world.placeholder}", world.url("/tls-mismatch", "mismatch.test")
    )
    assert done.stdout.endswith(b"502"), done
    assert world.paths("/tls-mismatch") == []
    event = world.proxy.wait_event(path="/tls-mismatch")
    assert event["credentials"] == [] and event["reason"] == "upstream_error"
