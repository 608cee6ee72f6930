"""Leak hygiene: the secret never appears in a deny page, an error body, a reflected response, a
log line or a core dump; the engine's own logs never print request content.

Defences: proxy/core/decide.py (deny bodies carry names and reasons, never values), proxy/core/scrub.py via
addons/scrub.py (a reflecting upstream gets the placeholder back), proxy/engine/master.py
``_log_to_stderr`` (WARNING level: mitmproxy never logs header values or bodies there),
proxy/engine/hardening.py ``harden`` called by proxy/cli/main.py ``main`` (no core dumps, not dumpable).
The session-wide scan of every file the suite wrote is tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import canary
import h2.config
import h2.connection
import h2.events
import pytest
from harness import ProxyProcess, World
from servers import TestCA
from world import Stage, credential, egress, rules

WIDE_PH = "surr_HostileWidePlaceholder002"


def test_deny_pages_and_error_bodies_never_hold_the_secret(world: World) -> None:
    ph = world.placeholder
    refusals = {
        "violation": world.curl(
            "-H", f"Authorization: Bearer {ph}", world.url("/leak-violation", "other.test")
        ),
        "method": world.curl("-X", "POST", "-H", f"Authorization: Bearer {ph}", world.url("/v1/leak-method")),
        "trace": world.curl("-X", "TRACE", "-H", f"Authorization: Bearer {ph}", world.url("/v1/leak-trace")),
        "cleartext": world.curl(
            "-H", f"Authorization: Bearer {ph}", f"http://plain.test:{world.upstream.port}/"
        ),
        "bad-tls": world.curl("-H", f"Authorization: Bearer {ph}", world.url("/leak-tls", "mismatch.test")),
    }
    statuses = {k: int(v.stdout.rsplit(b"\n", 1)[-1]) for k, v in refusals.items()}
    assert statuses == {"violation": 403, "method": 403, "trace": 405, "cleartext": 403, "bad-tls": 502}
    canary.assert_absent({f"{k} response": v.stdout + v.stderr for k, v in refusals.items()}, [world.secret])


@pytest.mark.parametrize("path", ["/reflect", "/reflect-split", "/reflect-gzip"])
def test_a_reflecting_upstream_hands_back_the_placeholder(world: World, path: str) -> None:
    done = world.curl(
        "--compressed",
        "-i",
        "-H",
        f"Authorization: Bearer {WIDE_PH}",
        world.url(path, "a.wild.test"),
        claim="wide",
    )
    assert done.stdout.endswith(b"200"), done
    assert f"Bearer {WIDE_PH}".encode() in done.stdout  # the upstream did reflect it
    canary.assert_absent({f"{path} response": done.stdout}, [world.secret])


def test_engine_logs_never_print_request_content(world: World) -> None:
    """Requests carrying a content canary in every place (headers, query, body, malformed heads,
    broken chunked bodies, garbage after CONNECT): stderr never shows it. (The audit event records
    the method, path and mitmproxy's error sentence by design, which can quote the sandbox's own
    bytes: so this value is not registered with the session-wide scan.)"""
    content = "CONTENT" + secrets.token_hex(12)
    port = world.upstream.port
    world.curl("-H", f"X-Content: {content}", "-d", f"body={content}", world.url(f"/v1/c?q={content}"))
    world.curl("-H", f"Authorization: Bearer {content}", world.url("/x", "other.test"))
    raw = [
        f"GET /v1/a HTTP/1.1\r\nHost: api.test:{port}\r\nX-{content}\x01: v\r\nConnection: close\r\n\r\n",
        f"GET /v1/b?{content} HTTP/1.1\r\nHost: api.test:{port}\r\nX: {content}\r\n folded\r\n"
        "Connection: close\r\n\r\n",
        f"POST /v1/c HTTP/1.1\r\nHost: api.test:{port}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
        f"\r\nzz{content}\r\n",
        f"{content} / HTTP/1.1\r\nConnection: close\r\n\r\n",
        f"GET /v1/d HTTP/1.1\r\nHost: api.test:{port}\r\nContent-Length: {content}\r\n"
        "Connection: close\r\n\r\n",
    ]
    for head in raw:
        world.tunnel_request(head.encode(), read_timeout=3)
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=3) as s:  # garbage, no CONNECT
        s.sendall(f"\x16\x03\x01{content}\r\n\r\n".encode())
        with contextlib.suppress(TimeoutError, ConnectionError):
            world.received.append(s.recv(65536))
    time.sleep(0.5)  # let the proxy finish logging
    stderr = world.proxy.stderr_path.read_bytes()
    assert stderr, "the proxy wrote nothing to stderr at all: the check would be empty"
    canary.assert_absent({"proxy stderr": stderr}, [content, world.secret])


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """A proxy whose dumpable flag can be read from outside: non-dumpable processes' /proc files
    belong to root (proc(5)). As root, the proxy runs with gid 65534, so a dumpable one would show
    that gid and a non-dumpable one gid 0."""
    with Stage(tmp_path_factory.mktemp("hardened")) as st:
        st.token("t", newline=False)
        proxy = st.proxy(rules(claims=[]), upstream_ca=None, start=False)
        if os.getuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root needs setpriv (util-linux) to observe the dumpable flag")
            proxy.args = [setpriv, "--regid=65534", "--clear-groups", *proxy.args]
            os.chmod(st.tmp, 0o755)
        yield proxy.start()


def test_the_running_proxy_cannot_dump_core(hardened: ProxyProcess) -> None:
    assert hardened.proc is not None
    limits = Path(f"/proc/{hardened.proc.pid}/limits").read_text().splitlines()
    [core] = [line for line in limits if line.startswith("Max core file size")]
    assert core.split()[4:6] == ["0", "0"], core


def test_the_running_proxy_is_not_dumpable(hardened: ProxyProcess) -> None:
    assert hardened.proc is not None
    st = os.stat(f"/proc/{hardened.proc.pid}/status")  # the directory's own inode may be stale
    if os.getuid() == 0:
        assert st.st_gid == 0, "a dumpable proxy's /proc entry would carry its gid 65534"
    else:
        assert st.st_uid == 0, "a dumpable proxy's /proc entry would belong to its own user"


# Each quotes the secret where mitmproxy's parser errors quote the offending bytes; the first
# fails header validation, which mitmproxy answers with an unconditional error page.
MALFORMED = [
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Bad\x01%s: v\r\nContent-Length: 0\r\n\r\n", id="invalid-header-name"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: %s\r\n\r\n", id="invalid-content-length"),
    pytest.param(b"HTTP/1.1 %s OK\r\nContent-Length: 0\r\n\r\n", id="invalid-status"),
    pytest.param(b"%s\r\n\r\n", id="garbage-status-line"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%s\r\n", id="invalid-chunk-size"),
    # review r4: the head cut off by the close ("unexpected server response: b'...'"), a folded
    # line with nothing to continue, a Content-Length list that disagrees, a 1xx head malformed
    pytest.param(b"HTTP/1.1 200 OK\r\nX-Cut: %s", id="head-cut-by-close"),
    pytest.param(b"HTTP/1.1 200 OK\r\n %s\r\nContent-Length: 0\r\n\r\n", id="fold-without-field"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 1, %s\r\n\r\n", id="content-length-list"),
    pytest.param(b"HTTP/1.1 103 Early\r\nX-Bad\x01%s: 1\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", id="bad-1xx-head"),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n%s\r\n", id="bad-second-chunk"
    ),
]


class _HostileUpstream:
    """A TLS server on loopback under the test CA, for ``name``, serving in a thread what its
    subclass's ``_serve`` writes; ``seen`` holds the Authorization values it received."""

    def __init__(self, ca: TestCA, name: str, alpn: list[str] | None = None) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if alpn:
            self.ctx.set_alpn_protocols(alpn)
        ca.ca.issue_cert(name).configure_cert(self.ctx)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


class _Reflector(_HostileUpstream):
    """A hostile HTTPS upstream that answers every request with a malformed response quoting the
    Authorization value it received (the real secret, after substitution)."""

    def __init__(self, ca: TestCA, name: str, template: bytes) -> None:
        self.template = template
        super().__init__(ca, name)

    def _serve(self) -> None:
        self.sock.settimeout(20)
        with contextlib.suppress(OSError), self.ctx.wrap_socket(self.sock.accept()[0], server_side=True) as c:
            head = b""
            while b"\r\n\r\n" not in head and (chunk := c.recv(65536)):
                head += chunk
            auth = next(
                (
                    line.split(b":", 1)[1].strip()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"authorization:")
                ),
                b"",
            )
            self.seen.append(auth)
            c.sendall(self.template % auth.replace(b" ", b""))


@pytest.mark.parametrize("template", MALFORMED)
def test_a_malformed_response_quoting_the_secret_never_shows_it(tmp_path: Path, template: bytes) -> None:
    """mitmproxy's parse errors quote the offending bytes: they must not carry the secret into the
    sandbox's error page, the audit event or the log."""
    with Stage(tmp_path) as st:
        secret = st.secret("k", tag="reflectbad", file="secret")
        st.token("t", newline=False)
        upstream = _Reflector(st.ca, "evil.test", template)
        st.defer(upstream.close)
        text = rules(
            [egress("evil.test", upstream.port)],
            claim_id="c",
            credentials=[credential("k", "surr_ReflectBadPlaceholder0001", ["evil.test"], "file:secret")],
        )
        proxy = st.proxy(text, ["evil.test"])
        done = subprocess.run(
            [
                "curl",
                "-sS",
                "-i",
                "-x",
                proxy.url("c", "t"),
                "--cacert",
                str(proxy.ca_pem),
                "-H",
                "Authorization: Bearer surr_ReflectBadPlaceholder0001",
                f"https://evil.test:{upstream.port}/x",
            ],
            capture_output=True,
            timeout=30,
            check=False,
        )
        st.received.append(done.stdout + done.stderr)  # checked for the secret when the stage closes
        time.sleep(0.3)
    assert upstream.seen == [f"Bearer {secret}".encode()]  # it did get the secret, and quoted it


def test_no_audit_field_holds_a_placeholder_the_sandbox_put_in_a_name(world: World) -> None:
    """Was: the audit's ``path`` hides placeholders, but a placeholder the sandbox put in a host
    name or a Host header landed as spelled in the event's ``host`` and ``message`` (a refused
    CONNECT to ``PH.evil.test``, a ``Host: PH.api.test`` inside a tunnel: 421 quoting it). Every
    text field of an audit event shows such a string as REDACTED."""
    ph = world.placeholder
    with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
        s.sendall(
            f"CONNECT {ph}.evil.test:1 HTTP/1.1\r\nHost: {ph}.evil.test:1\r\n"
            f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
        )
        world.received.append(s.recv(65536))
    port = world.upstream.port
    head = f"GET /v1/x HTTP/1.1\r\nHost: {ph}.api.test:{port}\r\nConnection: close\r\n\r\n"
    world.tunnel_request(head.encode())
    connect = world.proxy.wait_event(host="REDACTED.evil.test")
    assert connect["event"] == "tunnel" and connect["decision"] == "deny"
    mismatch = world.proxy.wait_event(reason="authority_mismatch", path="/v1/x")
    assert "REDACTED.api.test" in mismatch["message"]
    audit = world.proxy.audit_path.read_text()
    assert ph not in audit and ph.lower() not in audit


class _GoawayEcho(_HostileUpstream):
    """A hostile HTTP/2 upstream (h2 library, TLS with ALPN h2) that answers each request by
    closing the connection with a GOAWAY whose debug data is 20 bytes of the Authorization value
    it received (the real secret, after substitution), from the offset its path names."""

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), self.ctx.wrap_socket(raw, server_side=True) as tls:
                self._one(tls)

    def _one(self, tls: ssl.SSLSocket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())
        while data := tls.recv(65536):
            if conn.state_machine.state == h2.connection.ConnectionState.CLOSED:
                continue  # read on until the proxy closes, so that it reads the GOAWAY first
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    fields = {bytes(k): bytes(v) for k, v in event.headers}
                    secret = fields.get(b"authorization", b"").removeprefix(b"Bearer ")
                    self.seen.append(secret)
                    at = int(fields[b":path"].rsplit(b"/", 1)[1])
                    conn.close_connection(error_code=2, additional_data=secret[at : at + 20])
            tls.sendall(conn.data_to_send())


def test_an_http2_goaway_echoing_the_secret_leaves_no_trace_of_it_in_the_audit(tmp_path: Path) -> None:
    """Was: h2 prints a GOAWAY's debug data as hex (its first 20 bytes), mitmproxy's error message
    quotes that ("HTTP/2 connection closed: <ConnectionTerminated ... additional_data:53654b…>"),
    and no scrubber seeks hex: an upstream echoing the secret there put it, 20 bytes per request,
    in the audit event. Every such hex field is elided from error messages (addons/scrub.py)."""
    with Stage(tmp_path) as st:
        secret = st.secret("k", tag="goaway", file="secret")
        st.token("t", newline=False)
        upstream = _GoawayEcho(st.ca, "evil.test", alpn=["h2"])
        st.defer(upstream.close)
        text = rules(
            [egress("evil.test", upstream.port)],
            claim_id="c",
            credentials=[credential("k", "surr_GoawayEchoPlaceholder0001", ["evil.test"], "file:secret")],
        )
        proxy = st.proxy(text, ["evil.test"])
        offsets = range(0, len(secret), 10)
        for at in offsets:
            done = subprocess.run(
                ["curl", "-sS", "--http2", "-x", proxy.url("c", "t"), "--cacert", str(proxy.ca_pem),
                 "-H", "Authorization: Bearer surr_GoawayEchoPlaceholder0001",
                 f"https://evil.test:{upstream.port}/echo/{at}"],
                capture_output=True, timeout=30, check=False,
            )  # fmt: skip
            st.received.append(done.stdout + done.stderr)
        events = [proxy.wait_event(path=f"/echo/{at}") for at in offsets]
        audit = proxy.audit_path.read_bytes()
    assert upstream.seen == [secret.encode()] * len(offsets)  # it did get the secret, and echoed it
    raw = secret.encode()
    seen = audit.lower()  # any 6 bytes of it as hex, in either case
    assert not [i for i in range(len(raw) - 5) if raw[i : i + 6].hex().encode() in seen], "the secret's hex"
    assert [e["reason"] for e in events] == ["upstream_error"] * len(offsets)
    messages = [e["message"] for e in events]
    assert all("HTTP/2 connection closed" in m and "additional_data:…" in m for m in messages), messages
