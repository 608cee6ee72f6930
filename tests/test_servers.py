"""The e2e upstream (tests/servers.py) exercised directly, without the proxy, by real clients."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from servers import README_TEXT, TestCA, Upstream

GIT_PASSWORD = "git-pass-123"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def upstream(ca: TestCA, tmp_path: pathlib.Path) -> Iterator[Upstream]:
    with Upstream(ca, ["api.test", "localhost", "127.0.0.1"], GIT_PASSWORD, tmp_path) as up:
        yield up


def client(ca: TestCA, up: Upstream) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(ca.ca_pem))
    return httpx.Client(base_url=f"https://127.0.0.1:{up.port}", verify=ctx, timeout=10)


def test_default_endpoint_records_headers_without_echoing_them(ca: TestCA, upstream: Upstream):
    secret = "sk-live-must-not-come-back"
    with client(ca, upstream) as c:
        r = c.get("/v1/things?x=1", headers=[("X-Secret", secret), ("X-Dup", "a"), ("X-Dup", "b")])
    assert r.status_code == 200
    assert r.json() == {"ok": True, "method": "GET", "path": "/v1/things?x=1"}
    assert secret not in r.text and all(secret not in v for v in r.headers.values())
    [rec] = upstream.requests
    assert (rec.method, rec.path, rec.body_len) == ("GET", "/v1/things?x=1", 0)
    names = [k.lower() for k, _ in rec.headers]
    assert names.index("x-secret") < names.index("x-dup")
    assert upstream.header_values("x-secret") == [secret]
    assert upstream.header_values("X-DUP") == ["a", "b"]


def test_certificate_names_verify_with_curl(ca: TestCA, upstream: Upstream):
    for name in ("api.test", "localhost"):
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "--fail",
                "--cacert",
                str(ca.ca_pem),
                "--resolve",
                f"{name}:{upstream.port}:127.0.0.1",
                f"https://{name}:{upstream.port}/x",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert '"ok": true' in out.stdout
    assert upstream.header_values("host") == [f"api.test:{upstream.port}", f"localhost:{upstream.port}"]


def test_bytes_streams_exact_length(ca: TestCA, upstream: Upstream):
    n = 1024 * 1024
    with client(ca, upstream) as c, c.stream("GET", f"/bytes/{n}") as r:
        assert r.headers["content-type"] == "application/octet-stream"
        assert r.headers["content-length"] == str(n)
        assert sum(len(b) for b in r.iter_bytes()) == n


FIVE_MB = 5 * 1024 * 1024


def _chunks() -> Iterator[bytes]:
    for _ in range(FIVE_MB // 65536):
        yield b"u" * 65536


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_upload_counts_streamed_body(ca: TestCA, upstream: Upstream, framing: str):
    content = _chunks() if framing == "chunked" else b"u" * FIVE_MB
    with client(ca, upstream) as c:
        r = c.post("/upload", content=content)
    assert r.json() == {"received": FIVE_MB}
    [rec] = upstream.requests
    assert rec.body_len == FIVE_MB
    assert (framing == "chunked") == bool(upstream.header_values("transfer-encoding"))


def test_upload_put_with_curl_expect_continue(ca: TestCA, upstream: Upstream, tmp_path: pathlib.Path):
    src = tmp_path / "blob"
    src.write_bytes(b"p" * FIVE_MB)
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "--fail",
            "--cacert",
            str(ca.ca_pem),
            "-T",
            str(src),
            f"https://127.0.0.1:{upstream.port}/upload",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout == f'{{"received": {FIVE_MB}}}'
    assert upstream.header_values("expect") == ["100-continue"]


def test_sse_first_event_arrives_before_release(ca: TestCA, upstream: Upstream):
    with client(ca, upstream) as c, c.stream("GET", "/sse") as r:
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        assert "content-length" not in r.headers
        chunks = r.iter_raw()
        got = b""
        while b"\n\n" not in got:
            got += next(chunks)
        # The server is still parked on sse_release, so only the first event can be here.
        assert got == b"data: one\n\n"
        assert not upstream.sse_release.is_set()
        upstream.sse_release.set()
        got += b"".join(chunks)
    assert got == b"data: one\n\ndata: two\n\n"


def _git_clone(ca: TestCA, up: Upstream, password: str, dest: pathlib.Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "SSH_ASKPASS"))}
    env.update(
        GIT_SSL_CAINFO=str(ca.ca_pem),
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
    )
    return subprocess.run(
        [
            "git",
            "-c",
            f"http.curloptResolve=api.test:{up.port}:127.0.0.1",
            "clone",
            "-q",
            f"https://user:{password}@api.test:{up.port}/git/repo.git",
            str(dest),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_git_clone_with_right_password(ca: TestCA, upstream: Upstream, tmp_path: pathlib.Path):
    res = _git_clone(ca, upstream, GIT_PASSWORD, tmp_path / "clone")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "clone" / "README").read_text() == README_TEXT
    # The first request is unauthenticated (git retries with credentials after the 401),
    # and protocol v2 reached http-backend through the Git-Protocol header.
    assert upstream.requests[0].path.startswith("/git/repo.git/info/refs")
    assert upstream.header_values("authorization")
    assert "version=2" in upstream.header_values("git-protocol")
    assert any(r.method == "POST" and r.body_len > 0 for r in upstream.requests)


def test_git_clone_with_wrong_password_fails(ca: TestCA, upstream: Upstream, tmp_path: pathlib.Path):
    res = _git_clone(ca, upstream, "nope", tmp_path / "clone")
    assert res.returncode != 0
    assert "Authentication failed" in res.stderr
    assert not (tmp_path / "clone" / "README").exists()


def test_connections_counts_accepts_and_survives_bad_handshake(ca: TestCA, upstream: Upstream):
    with client(ca, upstream) as c:
        for _ in range(3):
            assert c.get("/keepalive").status_code == 200
    assert upstream.connections == 1  # keep-alive: three requests, one connection
    # Plaintext at a TLS port: the handshake fails, the connection still counts, and the
    # server closes it (waiting for that makes this deterministic) and keeps serving.
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):  # RST, as our bytes went unread
            while s.recv(4096):
                pass
    assert upstream.connections == 2
    with client(ca, upstream) as c:
        assert c.get("/after").status_code == 200
    assert upstream.connections == 3
    assert [r.path for r in upstream.requests] == ["/keepalive"] * 3 + ["/after"]


def test_stop_is_prompt_with_parked_sse_and_idle_keepalive(ca: TestCA, upstream: Upstream):
    with client(ca, upstream) as c:
        assert c.get("/idle").status_code == 200  # leaves an idle keep-alive connection
        with client(ca, upstream) as c2, c2.stream("GET", "/sse") as r:
            next(r.iter_raw())
            started = time.monotonic()
            upstream.stop()
            assert time.monotonic() - started < 5
    upstream.stop()  # idempotent
