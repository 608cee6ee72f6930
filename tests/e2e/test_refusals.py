"""Refusals every client can read (issue 18): Proxy-Status (RFC 9209) on every refusal and
upstream failure, surrogate's JSON instead of mitmproxy's HTML error page, gRPC answers to gRPC
requests, and the reason code in a refused CONNECT's status line. Real clients (curl, grpcio)
through a real proxy process, real loopback upstreams under a test CA.

The world: claim ``agent`` (pool ``p``) may GET /v1 on api.test, reach dead.test on a port
where nothing listens (connection refused), mismatch.test (pinned to the upstream, whose
certificate does not name it), and hangup.test (a TLS server that reads a request and closes, or
answers bytes that are not HTTP); 127.0.0.1 (a special-purpose address) and own.test on the
proxy's own port are allowed by rules, and refused after resolution. Its credential ``api`` is
bound to api.test and hangup.test.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import http_sf
import pytest
from harness import ProxyProcess, dead_port
from servers import TestCA, Upstream
from world import Stage, claim, credential, egress, rules

from proxy.core import refusals as table

pytestmark = pytest.mark.e2e

PH = "surr_RefusalsTestPlaceholder01"


class Hangup:
    """A TLS server for hangup.test: reads a request head, then for ``/close`` closes without a
    byte, for ``/quote`` writes the secret and bytes that are not HTTP, for anything else bytes
    that are not HTTP, and closes."""

    def __init__(self, ca: TestCA, secret: str) -> None:
        self.secret = secret.encode()
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert("hangup.test").configure_cert(self.ctx)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(raw,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        with contextlib.suppress(OSError), self.ctx.wrap_socket(raw, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head and (chunk := tls.recv(4096)):
                head += chunk
            path = head.split(b" ", 2)[1:2]
            if path == [b"/quote"]:  # a hostile upstream quoting the secret in garbage
                tls.sendall(self.secret + b" IS NOT HTTP\r\n\r\n")
            elif path != [b"/close"]:
                tls.sendall(b"THIS IS NOT HTTP\r\n\r\n")

    def stop(self) -> None:
        self.sock.close()


@dataclass
class World:
    proxy: ProxyProcess
    upstream: Upstream
    token: str
    secret: str
    dead_port: int
    hangup_port: int
    received: list[bytes] = field(default_factory=list)

    def curl(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[bytes]:
        """curl through the proxy as ``agent``, verbose (the heads are on stderr), body on stdout."""
        done = subprocess.run(
            [
                "curl", "-sS", "-v", "--max-time", "20",
                "-x", self.proxy.url("agent", token or self.token),
                "--cacert", str(self.proxy.ca_pem),
                *args,
            ],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        self.received.append(done.stdout + done.stderr)
        return done


def _rules(port: int, dead: int, hangup: int, own: int) -> str:
    return rules(
        [
            egress("api.test", port, methods=["GET"], paths=["/v1"]),
            egress("dead.test", dead),
            egress("mismatch.test", port),
            egress("hangup.test", hangup),
            egress("127.0.0.1", port),
            egress("own.test", own),
        ],
        claims=[claim("agent", [credential("api", PH, ["api.test", "hangup.test"], "file:secret")])],
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("refusals")) as st:
        secret = st.secret("api", tag="refusals", file="secret")
        token = st.token("agent-" + secrets.token_hex(8), newline=False)
        upstream = st.upstream(["api.test"])
        hangup = Hangup(st.ca, secret)
        st.defer(hangup.stop)
        dead = dead_port()  # bound, never listening: connection refused
        pins = ["api.test", "dead.test", "mismatch.test", "hangup.test", "own.test"]
        proxy = st.proxy(st.write(""), pins, start=False)
        proxy.rules.write_text(_rules(upstream.port, dead, hangup.port, proxy.port))
        proxy.start()
        yield World(proxy, upstream, token, secret, dead, hangup.port, st.received)


def _heads(stderr: bytes) -> list[str]:
    """The response head lines curl -v printed (``< …``)."""
    return [line[2:] for line in stderr.decode(errors="replace").splitlines() if line.startswith("< ")]


def _field(lines: list[str], name: str) -> list[str]:
    return [ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith(name.lower() + ":")]


def _proxy_status(value: str) -> tuple[str, dict[str, object]]:
    """The one Proxy-Status member, parsed as RFC 8941 says (the ``http-sf`` library)."""
    parsed = http_sf.parse(value.encode(), tltype="list")
    assert isinstance(parsed, list) and len(parsed) == 1, value
    name, params = parsed[0]  # type: ignore[misc]
    return str(name), {k: str(v) for k, v in params.items()}


def _check_refusal(
    w: World, done: subprocess.CompletedProcess[bytes], status: int, reason: str, error: str
) -> dict[str, object]:
    """curl's answer is surrogate's JSON refusal with Proxy-Status; returns the JSON."""
    heads = _heads(done.stderr)
    lines = [ln for ln in heads if ln.startswith("HTTP/")]
    assert lines and lines[-1].split(" ")[1] == str(status), heads
    assert not any("mitmproxy" in ln.lower() for ln in heads), heads
    assert _field(heads, "content-type")[-1] == "application/json", heads
    body = json.loads(done.stdout)
    assert body["error"] == reason, body
    assert b"<html" not in done.stdout.lower()
    name, params = _proxy_status(_field(heads, "proxy-status")[-1])
    assert (name, params["error"]) == ("surrogate", error), params
    assert params["details"] == f"{reason}; request_id={body['request_id']}"
    assert _field(heads, "x-surrogate-request-id")[-1] == body["request_id"]
    return body


# Each kind of upstream failure, with HTTP/1.1 and HTTP/2 toward curl: (id, host, path, type).
UPSTREAM_FAILURES = [
    ("connection_refused", "dead.test", "/x", "connection_refused"),
    ("tls_certificate", "mismatch.test", "/x", "tls_certificate_error"),
    ("closed_before_answer", "hangup.test", "/close", "connection_terminated"),
    ("not_http", "hangup.test", "/garbage", "http_protocol_error"),
]


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
@pytest.mark.parametrize(
    ("host", "path", "error"), [f[1:] for f in UPSTREAM_FAILURES], ids=[f[0] for f in UPSTREAM_FAILURES]
)
def test_an_upstream_failure_is_surrogates_json_with_its_proxy_status(
    world: World, host: str, path: str, error: str, proto: str
) -> None:
    port = {"dead.test": world.dead_port, "hangup.test": world.hangup_port}.get(host, world.upstream.port)
    auth = ["-H", f"Authorization: Bearer {PH}"] if host == "hangup.test" else []  # a bound host
    done = world.curl(proto, *auth, f"https://{host}:{port}{path}")
    body = _check_refusal(world, done, 502, "upstream_error", error)
    assert body["decision"] == "error" and host in str(body["message"])
    event = world.proxy.wait_event(request_id=body["request_id"])
    assert (event["reason"], event["status"]) == ("upstream_error", 502)


# Refusals of each kind this world can provoke (denied in a tunnel, by the address check, for a
# placeholder): each carries its table row's Proxy-Status type (proxy/core/refusals.py ROWS).
IN_TUNNEL = [
    ("method_not_allowed", "api.test", "-XPOST", 403),
    ("path_not_allowed", "api.test", "", 403),
    ("special_address", "127.0.0.1", "", 403),
    ("own_listener", "own.test", "", 403),
    ("placeholder_violation", "dead.test", f"Authorization: Bearer {PH}", 403),
]


@pytest.mark.parametrize(("reason", "host", "extra", "status"), IN_TUNNEL, ids=[r[0] for r in IN_TUNNEL])
def test_each_kind_of_refusal_carries_its_tables_type(
    world: World, reason: str, host: str, extra: str, status: int
) -> None:
    port = {"dead.test": world.dead_port, "own.test": world.proxy.port}.get(host, world.upstream.port)
    path = "/elsewhere" if reason == "path_not_allowed" else "/v1/x"
    args = ["-H", extra] if extra.startswith("Authorization") else [extra] if extra else []
    done = world.curl("--http1.1", *args, f"https://{host}:{port}{path}")
    row = table.ROWS[table.Reason(reason)]
    assert row is not None
    body = _check_refusal(world, done, status, reason, row.proxy_error)
    assert f"HTTP/1.1 {status} Forbidden ({reason})" in _heads(done.stderr)
    assert world.proxy.wait_event(request_id=body["request_id"])["reason"] == reason


def test_the_answer_to_an_upstream_failure_never_quotes_the_upstream(world: World) -> None:
    """mitmproxy's message quotes the upstream's bytes; surrogate's answer does not, and one
    quoting the secret is withheld (the connection closes: addons/scrub.py ``error``)."""
    url = f"https://hangup.test:{world.hangup_port}"
    done = world.curl("--http1.1", "-H", f"Authorization: Bearer {PH}", url + "/garbage")
    assert (
        b"NOT HTTP" not in done.stdout + done.stderr and json.loads(done.stdout)["error"] == "upstream_error"
    )
    done = world.curl("--http1.1", "-H", f"Authorization: Bearer {PH}", url + "/quote")
    assert world.secret.encode() not in done.stdout + done.stderr
    assert not any(h.startswith("HTTP/1.1 502") for h in _heads(done.stderr)), done.stderr  # closed


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_a_refused_request_inside_a_tunnel_has_proxy_status(world: World, proto: str) -> None:
    done = world.curl(proto, "-X", "POST", f"https://api.test:{world.upstream.port}/v1/x")
    body = _check_refusal(world, done, 403, "method_not_allowed", "http_request_denied")
    if proto == "--http1.1":
        assert "HTTP/1.1 403 Forbidden (method_not_allowed)" in _heads(done.stderr)
    assert world.proxy.wait_event(request_id=body["request_id"])["status"] == 403


@pytest.mark.parametrize(
    ("host", "token", "status", "reason"),
    [("denied.test", None, 403, "no_rule"), ("api.test", "wrong-token", 407, "proxy_auth_required")],
    ids=["no_rule", "proxy_auth_required"],
)
def test_a_refused_connect_shows_its_reason_in_curls_status_line(
    world: World, host: str, token: str | None, status: int, reason: str
) -> None:
    done = world.curl(f"https://{host}:{world.upstream.port}/", token=token)
    assert done.returncode != 0
    heads = _heads(done.stderr)
    phrase = {403: "Forbidden", 407: "Proxy Authentication Required"}[status]
    assert f"HTTP/1.1 {status} {phrase} ({reason})" in heads, heads
    name, params = _proxy_status(_field(heads, "proxy-status")[0])
    assert params["error"] == "http_request_denied" and params["details"].startswith(f"{reason}; request_id=")


# gRPC: a raw-bytes unary call (no protobuf needed), through the proxy with grpcio's own proxy
# support (CONNECT, Basic credentials from the URL), trusting the proxy's CA.
def _grpc_call(w: World, host: str, port: int, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.RpcError:
    creds = grpc.ssl_channel_credentials(root_certificates=w.proxy.ca_pem.read_bytes())
    options = [("grpc.http_proxy", w.proxy.url("agent", w.token)), ("grpc.enable_retries", 0)]
    with grpc.secure_channel(f"{host}:{port}", creds, options=options) as channel:
        call = channel.unary_unary(
            "/surrogate.test.Echo/Say", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as info:
            call(b"\x00", timeout=20, metadata=metadata)
    err = info.value
    w.received.append(repr(err).encode())
    return err


def test_a_grpc_client_sees_permission_denied_with_the_reason(world: World) -> None:
    """POST is not allowed on api.test: gRPC's PERMISSION_DENIED, the reason code and request id
    in the message, and the audit event's request id in it."""
    err = _grpc_call(world, "api.test", world.upstream.port, (("authorization", f"Bearer {PH}"),))
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED, err
    details = err.details() or ""
    assert "method_not_allowed" in details and "request_id" in details, details
    request_id = details.rsplit("request_id ", 1)[1].rstrip(")")
    event = world.proxy.wait_event(request_id=request_id)
    assert (event["reason"], event["status"]) == ("method_not_allowed", 200)


def test_a_grpc_client_sees_unavailable_for_an_upstream_failure(world: World) -> None:
    err = _grpc_call(world, "dead.test", world.dead_port)
    assert err.code() is grpc.StatusCode.UNAVAILABLE, err
    details = err.details() or ""
    assert "upstream_error" in details and "refused the connection" in details, details


def test_a_request_head_mitmproxy_cannot_parse_gets_the_json_refusal(world: World) -> None:
    """Before any flow: a request line mitmproxy's parser refuses (no request id)."""
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(b"GET\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request (bad_request_head)"), data
    assert b"mitmproxy" not in data.lower() and b"<html" not in data.lower()
    assert json.loads(body)["error"] == "bad_request_head"
    assert b'proxy-status: surrogate;error=http_request_error;details="bad_request_head"' in head.lower()


def _raw(w: World, data: bytes) -> bytes:
    """Send raw bytes to the proxy's listener; everything read back until it closes."""
    got = b""
    with socket.create_connection(("127.0.0.1", w.proxy.port), timeout=10) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                got += chunk
        except (ConnectionError, TimeoutError):
            pass  # closed while we still wrote: what it sent is in `got`
    w.received.append(got)
    return got


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (
            b"POST http://api.test/x HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"400 Bad Request",
            b"bad_request_body",
        ),
        (
            b"GET http://api.test/x HTTP/1.1\r\nHost: api.test\r\nX-Big: " + b"a" * (200 * 1024),
            b"431 Request Header Fields Too Large",
            b"bad_request_head",
        ),
    ],
    ids=["malformed-chunk", "unfinished-head"],
)
def test_refusals_made_inside_mitmproxys_readers_carry_proxy_status(
    world: World, data: bytes, status: bytes, reason: bytes
) -> None:
    """Refused before any flow exists (addons/malformed.py, addons/headlimit.py): no request id."""
    head, _, body = _raw(world, data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status + b" (" + reason + b")"), head
    assert b'proxy-status: surrogate;error=http_request_error;details="' + reason + b'"' in head.lower()
    assert json.loads(body)["error"] == reason.decode() and b"mitmproxy" not in head.lower()
