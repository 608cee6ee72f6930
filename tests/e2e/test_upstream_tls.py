"""Invariant 2: a secret leaves only over TLS that surrogate verified."""

from __future__ import annotations

import ssl

import httpx
import pytest
from conftest import NAMES, Env
from harness import ProxyProcess

pytestmark = pytest.mark.e2e


def test_unverifiable_upstream_gets_no_request_and_no_secret(env: Env) -> None:
    """The same rules and upstream, but a proxy that was not told to trust the upstream's CA."""
    untrusting = ProxyProcess(
        env.proxy.rules,
        env.proxy.workdir / "untrusting",
        resolve={n: "127.0.0.1" for n in NAMES},
        env={"E2E_INJECTED_SECRET": env.injected},
    )
    untrusting.workdir.mkdir()
    untrusting.start()
    try:
        ctx = ssl.create_default_context(cafile=untrusting.ca_pem)
        with httpx.Client(proxy=untrusting.url("c1", env.token), verify=ctx) as client:
            r = client.get(env.url("api.test", "/t/unverified"), headers={"X-Key": env.placeholder})
        env.received.append(r.content)
        assert r.status_code == 502
        event = untrusting.wait_event(path="/t/unverified")
        assert (event["decision"], event["reason"], event["status"]) == ("error", "upstream_error", 502)
        assert event["credentials"] == []  # the TLS handshake failed: no secret left the proxy
        assert "certificate" in event["message"].lower()
        log = untrusting.audit_path.read_text() + untrusting.stderr()
    finally:
        untrusting.stop()
    assert [x for x in env.upstream.requests if x.path == "/t/unverified"] == []
    for c in env.canaries:
        assert c not in log
