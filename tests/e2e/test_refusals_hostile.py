"""Hostile review of the refusal path (issue 18, review r-refusals): a sandbox that dresses its
request up to get another answer shape, and an upstream whose failure is told in its own words.
Real proxy process, real loopback upstream under a test CA, real clients (raw sockets, curl).

The world is tests/e2e/conftest.py's ``env``: claim ``c1`` may reach api.test and other.test;
denied.test has no rule; c1's placeholder is bound to api.test only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import canary
import h11
import http_sf
import pytest
from harness import Env, ProxyProcess, dead_port
from servers import TestCA
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e

GRPC_SPELLINGS = [
    "application/grpc",
    "application/grpc+proto",
    "APPLICATION/GRPC; charset=x",
    "application/grpc+json",
]


def _complete(method: bytes) -> Callable[[bytes], bool]:
    """Whether the bytes read so far hold one whole response to a ``method`` request (framed as
    h11 reads it): a kept-alive connection (a refused CONNECT stays open for the retry with
    credentials, RFC 9110 §9.3.6) is not waited on until it goes quiet."""
    reader = h11.Connection(h11.CLIENT)
    reader.send(h11.Request(method=method, target="/", headers=[("Host", "x")]))
    reader.send(h11.EndOfMessage())
    seen = 0

    def done(got: bytes) -> bool:
        nonlocal seen
        reader.receive_data(got[seen:])
        seen = len(got)
        while (event := reader.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return True
        return False

    return done


def _raw(env: Env, data: bytes, timeout: float = 5) -> bytes:
    """Send ``data`` to the proxy's listener; every byte read back until one whole response is in
    (when it is one h11 can frame), it closes, or it goes quiet."""
    got = b""
    complete: Callable[[bytes], bool] | None = _complete(data.split(b" ", 1)[0])
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=timeout) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                got += chunk
                try:
                    if complete is not None and complete(got):
                        break
                except h11.ProtocolError:
                    complete = None  # not a response h11 frames: read on until the end
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


SPOOF = (
    b"HTTP/1.1 403 Forbidden (no_rule)\r\n"
    b'Proxy-Status: surrogate;error=http_request_denied;details="no_rule; request_id=forged", '
    b"next-hop;error=dns_error\r\n"
    b'Proxy-Status: "Surrogate";error=proxy_loop_detected\r\n'
    b'Proxy-Status: surrogate;details="unclosed\r\n'
    b"X-Surrogate-Request-Id: forged\r\n"
    b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
)


class Liar:
    """A TLS server for liar.test that reads a request head and, for ``/partial/WORDS``, writes
    an unfinished response head whose header says WORDS (``secret``: the canary) and closes; for
    ``/short`` a head announcing 100 bytes and 10 of them; for anything else closes without a
    byte (the request's body unread)."""

    def __init__(self, ca: TestCA, secret: str) -> None:
        self.secret = secret
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert("liar.test").configure_cert(self.ctx)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

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
            path = unquote(head.split(b" ", 2)[1].decode())
            if path.startswith("/partial/"):
                b64 = base64.b64encode(b"u:" + self.secret.encode()).decode()  # as in Basic credentials
                words = (
                    path.removeprefix("/partial/").replace("secretb64", b64).replace("secret", self.secret)
                )
                tls.sendall(b"HTTP/1.1 200 OK\r\nX-Why: " + words.encode())
            elif path == "/spoof":  # an answer dressed up as surrogate's refusal
                tls.sendall(SPOOF)
            elif path == "/short":  # a response that starts, then ends short of its length
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")

    def stop(self) -> None:
        self.sock.close()


@dataclass
class LiarWorld:
    proxy: ProxyProcess
    liar: Liar
    token: str
    secret: str
    dead_port: int
    received: list[bytes] = field(default_factory=list)


@pytest.fixture(scope="module")
def liar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiarWorld]:
    with Stage(tmp_path_factory.mktemp("liar")) as st:
        secret = st.secret("api", tag="liar", file="secret")
        token = st.token(secrets.token_hex(8), newline=False)
        server = Liar(st.ca, secret)
        st.defer(server.stop)
        dead = dead_port()  # bound, never listening: connection refused
        text = rules(
            [egress("liar.test", server.port), egress("dead.test", dead)],
            claims=[claim("agent", [credential("api", PH, ["liar.test", "dead.test"], "file:secret")])],
        )
        proxy = st.proxy(text, ["liar.test", "dead.test"])
        yield LiarWorld(proxy, server, token, secret, dead, st.received)


PH = "surr_RefusalsHostilePlaceholder1"
LIES = ["certificate verify failed", "[Errno 111] connection refused", "timed out", "no route", "TLS"]


def _liar_curl(liar: LiarWorld, proto: str, words: str) -> tuple[list[str], bytes]:
    done = subprocess.run(
        [
            "curl", "-sS", "-v", proto, "--max-time", "20", "-x", liar.proxy.url("agent", liar.token),
            "--cacert", str(liar.proxy.ca_pem), "-H", f"Authorization: Bearer {PH}",
            f"https://liar.test:{liar.liar.port}/partial/{quote(words)}",
        ],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    liar.received.append(done.stdout + done.stderr)
    heads = [ln[2:] for ln in done.stderr.decode(errors="replace").splitlines() if ln.startswith("< ")]
    return heads, done.stdout


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
@pytest.mark.parametrize("lie", LIES)
def test_an_upstreams_words_never_choose_its_failures_proxy_status(
    liar: LiarWorld, lie: str, proto: str
) -> None:
    """mitmproxy quotes an unfinished response head in its message ("unexpected server response:
    b'…'"); the Proxy-Status type and surrogate's sentence come from mitmproxy's words only."""
    heads, body_bytes = _liar_curl(liar, proto, lie)
    assert [h for h in heads if h.startswith("HTTP/")][-1].split(" ")[1] == "502", heads
    value = next(h.split(":", 1)[1].strip() for h in heads if h.lower().startswith("proxy-status:"))
    [(_, params)] = http_sf.parse(value.encode(), tltype="list")  # type: ignore[misc]
    body = json.loads(body_bytes)
    assert (str(params["error"]), body["error"]) == ("http_protocol_error", "upstream_error"), value
    assert lie.lower() not in body["message"].lower()


@pytest.mark.parametrize("spelling", ["secret", "secretb64"], ids=["raw", "base64"])
@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_an_unfinished_head_quoting_the_secret_is_withheld(
    liar: LiarWorld, proto: str, spelling: str
) -> None:
    """The same failure quoting the secret: the connection closes (README, *An upstream error that
    quotes a secret is withheld*); no byte of it, in any spelling, reaches the sandbox (nor the
    audit file or the proxy's stderr: the fixture's canary check)."""
    heads, body = _liar_curl(liar, proto, spelling)
    assert not [h for h in heads if h.startswith("HTTP/") and " 200 Connection" not in h], heads
    canary.assert_absent({"answer": body + "\n".join(heads).encode()}, [liar.secret])


@pytest.mark.parametrize("where", ["closes", "refuses"])
def test_an_upstream_failure_after_100_continue_is_still_answered(liar: LiarWorld, where: str) -> None:
    """mitmproxy answers ``Expect: 100-continue`` itself, before it connects upstream (curl sends
    it with every upload over 1 MiB); the failure that follows still gets surrogate's 502, not an
    empty reply (the audit event said 502 while the client got nothing)."""
    url = {
        "closes": f"https://liar.test:{liar.liar.port}/close",
        "refuses": f"https://dead.test:{liar.dead_port}/x",
    }[where]
    done = subprocess.run(
        [
            "curl", "-sS", "-v", "--http1.1", "--max-time", "20", "-x", liar.proxy.url("agent", liar.token),
            "--cacert", str(liar.proxy.ca_pem), "-H", "Expect: 100-continue",
            "--data-binary", "x" * 20000, url,
        ],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    liar.received.append(done.stdout + done.stderr)
    heads = [ln[2:] for ln in done.stderr.decode(errors="replace").splitlines() if ln.startswith("< ")]
    assert "HTTP/1.1 100 Continue" in heads, heads
    assert "HTTP/1.1 502 Bad Gateway (upstream_error)" in heads, heads
    body = json.loads(done.stdout)
    assert body["error"] == "upstream_error"
    event = liar.proxy.wait_event(request_id=body["request_id"])
    assert (event["reason"], event["status"]) == ("upstream_error", 502)


def _tunnel(env: Env, data: bytes, host: str = "api.test") -> bytes:
    """``data`` through c1's CONNECT tunnel and TLS to ``host``; every byte read back."""
    port = env.upstream.port
    got = b""
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: {_auth(env)}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(env.proxy.ca_pem))
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            try:
                tls.sendall(data)
                while chunk := tls.recv(65536):
                    got += chunk
            except (ConnectionError, ssl.SSLError, TimeoutError):
                pass
    env.received.append(got)
    return got


# Requests mitmproxy refuses itself (its validate_request: framing headers that can be read two
# ways), in a tunnel and as absolute-form: (id, how it is sent, the request's bytes).
_TE_CL = b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
MITMPROXY_REFUSES = [
    ("te-and-cl", "tunnel", b"POST /te-cl HTTP/1.1\r\nHost: api.test\r\n" + _TE_CL + b"\r\n0\r\n\r\n"),
    ("te-gzip", "tunnel", b"POST /te-gzip HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip\r\n\r\n"),
    ("absolute-te-and-cl", "direct", b"POST http://api.test/abs HTTP/1.1\r\nHost: api.test\r\n" + _TE_CL),
]


@pytest.mark.parametrize(
    ("how", "data"), [m[1:] for m in MITMPROXY_REFUSES], ids=[m[0] for m in MITMPROXY_REFUSES]
)
def test_a_request_mitmproxy_refuses_is_audited_as_what_the_sandbox_was_told(
    env: Env, how: str, data: bytes
) -> None:
    """The answer said ``400 bad_request_head`` (a deny); the audit event with its request id
    said ``error upstream_error 502``, and the metrics counted an upstream failure."""
    if how == "tunnel":
        got = _tunnel(env, data)
    else:
        got = _raw(env, data + f"Proxy-Authorization: {_auth(env)}\r\n\r\n0\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 400 Bad Request (bad_request_head)\r\n"), got
    body = json.loads(got.partition(b"\r\n\r\n")[2])
    event = env.proxy.wait_event(request_id=body["request_id"])
    assert (event["decision"], event["reason"], event["status"]) == ("deny", "bad_request_head", 400), event


def test_a_request_no_hook_saw_gets_no_request_id(env: Env) -> None:
    """A request without a Host (mitmproxy refuses it before any hook: it has no audit event)
    is answered without a request id, as the refusals made inside mitmproxy's readers are, not
    with one that ``surrogate audit why`` cannot find."""
    got = _raw(env, f"GET /no-host HTTP/1.1\r\nProxy-Authorization: {_auth(env)}\r\n\r\n".encode())
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request (bad_request_head)\r\n"), got
    assert json.loads(body)["request_id"] is None and b"x-surrogate-request-id" not in head.lower()
    assert b'proxy-status: surrogate;error=destination_not_found;details="bad_request_head"' in head.lower()


def test_a_refused_head_request_gets_no_body(env: Env) -> None:
    """RFC 9110 §9.3.2: an answer to HEAD has no content. The JSON refusal's bytes after the
    head were read, on a kept-alive HTTP/1 connection, as the start of the next response."""
    head = f"HEAD /head HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer {env.placeholder}\r\n\r\n"
    nxt = "GET /next HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
    got = _tunnel(env, (head + nxt).encode(), host="other.test")
    first, _, rest = got.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 403 Forbidden (placeholder_violation)\r\n"), got
    assert b"proxy-status: surrogate;error=http_request_denied" in first.lower()
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and b'"path": "/next"' in rest, got


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_an_upstream_cannot_dress_its_answer_up_as_surrogates_refusal(liar: LiarWorld, proto: str) -> None:
    """Only surrogate names itself: an upstream's X-Surrogate-Request-Id is dropped and its
    Proxy-Status keeps only the members that name someone else (RFC 9209 §2: each intermediary
    its own member)."""
    heads, body = _curl_liar(liar, proto, "/spoof")
    assert body == b"{}", body
    fields = [h.lower() for h in heads]
    assert not any(f.startswith("x-surrogate-request-id") for f in fields), heads
    assert [f for f in fields if f.startswith("proxy-status")] == [
        "proxy-status: next-hop;error=dns_error"
    ], heads


def _curl_liar(liar: LiarWorld, proto: str, path: str) -> tuple[list[str], bytes]:
    done = subprocess.run(
        [
            "curl", "-sS", "-v", proto, "--max-time", "20", "-x", liar.proxy.url("agent", liar.token),
            "--cacert", str(liar.proxy.ca_pem), f"https://liar.test:{liar.liar.port}{path}",
        ],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    liar.received.append(done.stdout + done.stderr)
    return [
        ln[2:] for ln in done.stderr.decode(errors="replace").splitlines() if ln.startswith("< ")
    ], done.stdout
