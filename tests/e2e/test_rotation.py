"""A rotated credential file is used by the very next request, with its new version audited."""

from __future__ import annotations

import ssl

import canary
import httpx
import pytest
from harness import Env

pytestmark = pytest.mark.e2e


def test_rotated_file_value_is_used_by_the_next_request(env: Env) -> None:
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx) as client:
        first = client.get(env.url("api.test", "/t/rot-1"), headers={"X-Api-Key": env.placeholder})
        rotated = canary.make("rotated")
        env.more_canaries.append(rotated)
        env.secret_file.write_text(rotated + "\n")
        # Same keep-alive connection: the new value must still apply from the next request on.
        second = client.get(env.url("api.test", "/t/rot-2"), headers={"X-Api-Key": env.placeholder})
    env.received += [first.content, second.content]
    assert first.status_code == second.status_code == 200
    sent = {
        r.path: dict(r.headers)["X-Api-Key"] for r in env.upstream.requests if r.path.startswith("/t/rot-")
    }
    assert sent == {"/t/rot-1": env.secret, "/t/rot-2": rotated}
    assert env.proxy.wait_event(path="/t/rot-2")["credentials"][0] == {"name": "gh", "version": 2}


def test_unreadable_credential_fails_closed(env: Env) -> None:
    env.secret_file.unlink()
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx) as client:
        r = client.get(env.url("api.test", "/t/gone"), headers={"X-Api-Key": env.placeholder})
    env.received.append(r.content)
    assert r.status_code == 503
    assert r.json()["error"] == "credential_unavailable"
    assert [x for x in env.upstream.requests if x.path == "/t/gone"] == []
