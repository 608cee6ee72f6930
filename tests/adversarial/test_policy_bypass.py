"""Policy bypass: rule precedence and connection state must not let a request reach what its
intercepting rule forbids. Defences: proxy/core/decide.py (an opaque rule never approves a request
inside an intercepted tunnel), addons/identify.py and addons/policy.py (a refused CONNECT leaves
no tunnel state behind)."""

from __future__ import annotations

import http.client
import socket

import pytest
from harness import World, status_line


def test_a_later_opaque_rule_never_approves_a_request_in_an_intercepted_tunnel(world: World) -> None:
    """Was: POST /admin on api.test (intercepting rule: GET /v1 only) was allowed by the later
    `*` rule with intercept: false, and got the secret."""
    before = world.upstream.connections
    done = world.curl(
        "-X",
        "POST",
        "-d",
        "x=1",
        "-H",
        f"Authorization: Bearer {world.placeholder}",
        world.url("/admin/delete"),
    )
    assert done.stdout.endswith(b"403") and b"method_not_allowed" in done.stdout
    assert world.paths("/admin") == [] and world.upstream.connections == before
    ok = world.curl("-H", f"Authorization: Bearer {world.placeholder}", world.url("/v1/ok"))
    assert ok.stdout.endswith(b"200")


def test_refused_connect_leaves_no_tunnel_behind(world: World) -> None:
    """Was: after a refused CONNECT, the next plain-HTTP request on the same connection was
    judged against the refused tunnel's host (421)."""
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(
            f"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test:443\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
        )
        # The refusal's whole response (head and JSON body), so the next read starts at the next
        # response: a body left over from a lone recv() once read as the second response, and its
        # request id happened to hold "421".
        first_response = http.client.HTTPResponse(s)
        first_response.begin()
        first = first_response.read()
        other = f"other.test:{world.upstream.port}"
        s.sendall(
            f"GET http://{other}/after HTTP/1.1\r\nHost: {other}\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\nConnection: close\r\n\r\n".encode()
        )
        second = b""
        while chunk := s.recv(65536):
            second += chunk
    world.received += [first, second]
    assert first_response.status == 403 and b"port_not_allowed" in first
    # judged on its own: plain http:// to other.test is not allowed by any rule (403), never 421
    assert status_line(second) == b"403" and b"scheme_not_allowed" in second, second[:300]


def test_an_unauthenticated_request_never_reaches_an_upstream(world: World) -> None:
    before = world.upstream.connections
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        port = world.upstream.port
        s.sendall(f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode())
        data = s.recv(65536)
    world.received.append(data)
    assert data.startswith(b"HTTP/1.1 407")
    assert world.upstream.connections == before


def test_an_egress_path_prefix_is_matched_on_the_canonical_path(world: World) -> None:
    """api.test allows GET /v1 only. /%761 is /v1 (an unreserved escape) and passes; spellings an
    upstream could read as a path outside /v1 are 400 ambiguous_path and never connect; a spelling
    the prefix does not cover in every reading (//v1, /V1) is 403 path_not_allowed."""
    ok = world.curl(world.url("/%761/spelled"))
    assert ok.stdout.endswith(b"200") and world.paths("/%761/spelled") == ["/%761/spelled"]
    before, sent = world.upstream.connections, len(world.upstream.requests)
    for path in [
        "/v1/../admin",
        "/v1/%2e%2e/admin",
        "/v1/..;/admin",
        "/v1%2f..%2fadmin",
        "/v1/%5c..",
        "/v1/a%00",
    ]:
        done = world.curl("--path-as-is", world.url(path))
        assert done.stdout.endswith(b"400") and b"ambiguous_path" in done.stdout, (path, done.stdout)
        assert path.encode() not in done.stdout  # the refusal does not echo the path
    for path in ["//v1/x", "/V1/x", "/v1;x/../admin"]:
        done = world.curl("--path-as-is", world.url(path))
        assert done.stdout.endswith((b"403", b"400")), (path, done.stdout)
    assert (world.upstream.connections, len(world.upstream.requests)) == (before, sent)


def test_a_fragment_in_the_request_target_is_refused_where_paths_decide(world: World) -> None:
    """Was: ``GET /v1#/../admin`` (api.test allows GET /v1 only) was allowed and forwarded as
    sent: the matchers read the path up to ``#``, while servers that take ``#`` as a path
    character (Go's ParseRequestURI, hypercorn and uvicorn's scope path) and then resolve dot
    segments (Go's FileServer, Starlette's StaticFiles: ``normpath``) serve ``/admin``. A request
    target never holds a fragment (RFC 9112 §3.2); where paths decide it is 400 ambiguous_path
    and never connects, in every spelling of what follows the ``#``."""
    before, sent = world.upstream.connections, len(world.upstream.requests)
    for target in ["/v1#/../admin", "/v1#x", "/v1/ok#", "/v1#/%2e%2e/admin?q=1", "/v1?q#/../../admin"]:
        head = f"GET {target} HTTP/1.1\r\nHost: api.test:{world.upstream.port}\r\nConnection: close\r\n\r\n"
        data = world.tunnel_request(head.encode())
        assert status_line(data) == b"400" and b"ambiguous_path" in data, (target, data[:200])
    assert (world.upstream.connections, len(world.upstream.requests)) == (before, sent)


NOT_HTTP = {
    "ssh-greeting": b"SSH-2.0-OpenSSH_9.2\r\n",
    "binary": b"\x00\x01\x02\x03 not a request\n",
    "no-space": b"HELLO\r\n\r\n",
    "dns-over-tcp": b"\x00\x1d\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    b"\x06secret\x07example\x00\x00\x01\x00\x01",
}


@pytest.mark.parametrize("data", NOT_HTTP.values(), ids=list(NOT_HTTP))
def test_bytes_that_are_not_http_are_never_relayed_inside_an_intercepted_tunnel(
    world: World, data: bytes
) -> None:
    """Review r3: mitmproxy's detection relayed non-HTTP bytes as raw TCP to the tunnel's host
    (api.test: GET /v1 only), past every method and path rule, unaudited. They are read as HTTP
    now: a 400 or a closed connection (mitmproxy's answer to a request line it cannot read), and
    no upstream connection (addons/tunnel.py)."""
    before = world.upstream.connections
    answer = world.tunnel_request(data, read_timeout=5)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert world.upstream.connections == before
