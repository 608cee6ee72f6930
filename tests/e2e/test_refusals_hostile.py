"""Hostile review of the refusal path (issue 18, review r-refusals): a sandbox that dresses its
request up to get another answer shape, and an upstream whose failure is told in its own words.
Real proxy process, real loopback upstream under a test CA, real clients (raw sockets, curl).

The world is tests/e2e/conftest.py's ``env``: claim ``c1`` may reach api.test and other.test;
denied.test has no rule; c1's placeholder is bound to api.test only.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess

import pytest
from harness import Env

pytestmark = pytest.mark.e2e

GRPC_SPELLINGS = [
    "application/grpc",
    "application/grpc+proto",
    "APPLICATION/GRPC; charset=x",
    "application/grpc+json",
]


def _raw(env: Env, data: bytes, timeout: float = 5) -> bytes:
    """Send ``data`` to the proxy's listener; every byte read back until it closes or goes quiet."""
    got = b""
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=timeout) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionError, TimeoutError):
            pass
    env.received.append(got)
    return got


def _auth(env: Env) -> str:
    return "Basic " + base64.b64encode(f"c1:{env.token}".encode()).decode()


@pytest.mark.parametrize("content_type", GRPC_SPELLINGS)
@pytest.mark.parametrize("who", ["no-credential", "claim"])
def test_a_refused_connect_that_says_grpc_is_refused_not_a_tunnel(
    env: Env, who: str, content_type: str
) -> None:
    """A gRPC answer is HTTP 200; to a CONNECT that would be the tunnel's "established" (mitmproxy
    opened it, ran http_connected on a refused flow, and no audit event was written)."""
    auth = f"Proxy-Authorization: {_auth(env)}\r\n" if who == "claim" else ""
    head = (
        f"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n{auth}"
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    got = _raw(env, head)
    status, reason = (407, "proxy_auth_required") if who == "no-credential" else (403, "no_rule")
    assert got.split(b"\r\n", 1)[0].startswith(f"HTTP/1.1 {status} ".encode()), got
    assert f"({reason})".encode() in got.split(b"\r\n", 1)[0]
    body = json.loads(got.partition(b"\r\n\r\n")[2])
    assert body["error"] == reason and b"grpc-status" not in got.lower()
    event = env.proxy.wait_event(request_id=body["request_id"])
    assert (event["reason"], event["status"]) == (reason, status)
    assert "Traceback" not in env.proxy.stderr()


def _curl_v(env: Env, *args: str) -> tuple[list[str], bytes]:
    done = subprocess.run(
        [
            "curl", "-sS", "-v", "--max-time", "20", "-x", env.proxy_url,
            "--cacert", str(env.proxy.ca_pem), *args,
        ],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    env.received.append(done.stdout + done.stderr)
    heads = [ln[2:] for ln in done.stderr.decode(errors="replace").splitlines() if ln.startswith("< ")]
    return heads, done.stdout


def _violation(env: Env, proto: str, method: str, content_type: str) -> tuple[list[str], bytes]:
    """c1's placeholder toward other.test (allowed, not bound): refused as a violation."""
    return _curl_v(
        env, proto, "-X", method, "-H", f"Content-Type: {content_type}",
        "-H", f"Authorization: Bearer {env.placeholder}", env.url("other.test", "/pkg.Svc/Call"),
    )  # fmt: skip


@pytest.mark.parametrize("content_type", GRPC_SPELLINGS[:2])
@pytest.mark.parametrize(
    ("proto", "method"),
    [("--http1.1", "POST"), ("--http2", "GET"), ("--http2", "PUT")],
    ids=["h1-post", "h2-get", "h2-put"],
)
def test_a_request_that_is_not_grpc_but_says_so_gets_the_json_refusal(
    env: Env, proto: str, method: str, content_type: str
) -> None:
    """gRPC is a POST over HTTP/2 (gRPC's PROTOCOL-HTTP2); anything else that claims its
    Content-Type gets the plain refusal: a 403, not a 200 that an HTTP/1 client reads as success
    (and with no framing, only the connection's end tells it the answer is over)."""
    heads, body = _violation(env, proto, method, content_type)
    status = [h for h in heads if h.startswith("HTTP/")][-1]
    assert status.split(" ")[1] == "403", heads
    assert json.loads(body)["error"] == "placeholder_violation"
    assert not any(h.lower().startswith("grpc-") for h in heads), heads


def test_a_grpc_request_still_gets_the_grpc_answer(env: Env) -> None:
    heads, body = _violation(env, "--http2", "POST", "application/grpc")
    assert [h for h in heads if h.startswith("HTTP/")][-1].startswith("HTTP/2 200"), heads
    assert "grpc-status: 7" in heads and body == b""
