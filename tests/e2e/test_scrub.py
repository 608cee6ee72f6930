"""Reflection end to end: an upstream that echoes every header, the query and the body back, raw
and escaped, in every content coding and as SSE, over HTTP/1.1 and HTTP/2 from the client, never
hands the sandbox the secret; a body that cannot be scanned closes the connection, audited."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, quote_plus

import httpx
import pytest
from _env import env_rules
from h2server import H2Echo
from harness import Env

pytestmark = pytest.mark.e2e

ENCODINGS = ["identity", "gzip", "deflate", "br", "zstd"]


def _forms(secret: str) -> dict[str, bytes]:
    """The spellings of ``secret`` scrubbing catches (base64 slices: the part S fully decides)."""
    raw = secret.encode()
    forms = {
        "raw": raw,
        "percent": quote(secret, safe="").encode(),
        "percent-plus": quote_plus(secret).encode(),
        "json-u": "".join(f"\\u{ord(c):04x}" for c in secret).encode(),
    }
    for urlsafe in (False, True):
        enc = base64.urlsafe_b64encode if urlsafe else base64.standard_b64encode
        for k in range(3):
            forms[f"b64-{k}-{urlsafe}"] = enc(b"\0" * k + raw)[-(-8 * k // 6) : 8 * (k + len(raw)) // 6]
    return forms


def _leaks(env: Env, data: bytes) -> list[str]:
    return [f"{name} of {c[:10]}…" for c in env.canaries for name, f in _forms(c).items() if f in data]


@pytest.fixture(scope="module")
def h2(env: Env) -> Iterator[H2Echo]:
    """An HTTP/2 echo upstream for api.test, allowed by editing the rules file (reloaded live)."""
    assert env.ca is not None
    server = H2Echo(env.ca, ["api.test"], env.proxy.workdir).start()
    env.proxy.rules.write_text(env_rules(env.upstream.port, more_ports=[server.port]))
    env.proxy.wait_event(event="reload", outcome="applied", timeout=10)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Fetched:
    status: int
    version: str  # "1.1" or "2"
    head: bytes  # the response head as received
    body: bytes
    arrivals: list[float]  # seconds from the start at which each read of the body arrived
    ok: bool  # the response ended normally


class _Target:
    """The HTTP/1.1 upstream with httpx, or the HTTP/2 one with curl --http2 (httpx behind a
    CONNECT proxy offers ALPN "http/1.1" first, which mitmproxy, honouring the client's order,
    takes; curl offers h2 first)."""

    def __init__(self, env: Env, h2: H2Echo | None) -> None:
        self.env, self.h2 = env, h2
        self.port = h2.port if h2 else env.upstream.port
        self.requests = h2.requests if h2 else env.upstream.requests

    def url(self, path: str) -> str:
        return f"https://api.test:{self.port}{path}"

    def fetch(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Fetched:
        got = self._curl(method, path, headers, body) if self.h2 else self._httpx(method, path, headers, body)
        self.env.received.append(got.head + b"\n" + got.body)
        return got

    def _httpx(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Fetched:
        ctx = ssl.create_default_context(cafile=self.env.proxy.ca_pem)
        pieces, arrivals, start = [], [], time.monotonic()
        status, head, ok = 0, b"", False
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.Client(proxy=self.env.proxy_url, verify=ctx, timeout=30) as c,
        ):
            with c.stream(method, self.url(path), headers=headers, content=body or None) as r:
                status = r.status_code
                head = b"\n".join(k + b": " + v for k, v in r.headers.raw)
                for piece in r.iter_raw():
                    pieces.append(piece)
                    arrivals.append(time.monotonic() - start)
                    assert sum(map(len, pieces)) < (64 << 20)
            ok = True
        return Fetched(status, "1.1", head, b"".join(pieces), arrivals, ok)

    def _curl(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Fetched:
        work = self.env.proxy.workdir
        cmd = ["curl", "-sS", "-N", "--http2", "--max-time", "30", "-x", self.env.proxy_url]
        cmd += ["--cacert", str(self.env.proxy.ca_pem), "-D", str(work / "curl-head"), "-X", method]
        cmd += [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
        if body:  # on stdin: a file under basetemp holding a canary would fail the session's scan
            cmd += ["--data-binary", "@-"]
        start = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, self.url(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(body)
        proc.stdin.close()
        pieces, arrivals = [], []
        while piece := os.read(proc.stdout.fileno(), 1 << 16):
            pieces.append(piece)
            arrivals.append(time.monotonic() - start)
            assert sum(map(len, pieces)) < (64 << 20)
        proc.stdout.close()
        ok = proc.wait(30) == 0
        head = (work / "curl-head").read_bytes() if (work / "curl-head").exists() else b""
        head = b"HTTP/" + head.rsplit(b"\r\nHTTP/", 1)[-1].removeprefix(b"HTTP/")  # after CONNECT's
        status_line = head.split(b"\r\n", 1)[0].split()
        status = int(status_line[1]) if len(status_line) > 1 else 0
        version = status_line[0].decode().removeprefix("HTTP/") if status_line else ""
        return Fetched(status, version, head, b"".join(pieces), arrivals, ok)


@pytest.fixture(params=["http1.1", "http2"])
def target(request: pytest.FixtureRequest, env: Env) -> _Target:
    return _Target(env, request.getfixturevalue("h2") if request.param == "http2" else None)


@pytest.mark.parametrize("enc", ENCODINGS)
def test_an_echo_of_headers_query_and_body_hands_back_placeholders_only(
    env: Env, target: _Target, enc: str
) -> None:
    """The secret reaches the echo in a header (substituted from its placeholder); the test
    client also puts it into the query and the body itself, standing for an upstream that knows
    it. Every spelling of it comes back as the placeholder, in every coding, decoded."""
    path = f"/echo?enc={enc}&q={quote(env.secret)}"
    headers = {"Authorization": f"Bearer {env.placeholder}", "X-Api-Key": env.placeholder}
    r = target.fetch("POST", path, headers, json.dumps({"token": env.secret}).encode())
    assert (r.status, r.ok) == (200, True)
    assert r.version == ("2" if target.h2 else "1.1")
    assert b"content-encoding" not in r.head.lower()  # sent decoded
    assert _leaks(env, r.head + r.body) == []
    assert re.search(rb"(?im)^x-echo: Bearer " + env.placeholder.encode() + rb"\r?$", r.head)
    assert f"Bearer {env.placeholder}".encode() in r.body
    assert base64.b64encode(env.placeholder.encode()).rstrip(b"=") in r.body  # X-Api-Key, alone
    [rec] = [x for x in target.requests if x.path == path]
    assert ("authorization", f"Bearer {env.secret}") in [(k.lower(), v) for k, v in rec.headers]


def test_sse_events_are_scrubbed_and_streamed_one_by_one(env: Env, target: _Target) -> None:
    """Each event comes in two reads 5 ms apart, cut inside the secret: the events arrive as they
    are sent (many reads, spread over the stream) and none holds the secret."""
    r = target.fetch("GET", "/echo?sse=1", {"Authorization": f"Bearer {env.placeholder}"})
    assert (r.status, r.ok) == (200, True)
    assert _leaks(env, r.head + r.body) == []
    assert f"data: Bearer {env.placeholder}\n\n".encode() in r.body
    events = r.body.count(b"\n\n")
    assert events > 10
    assert len(r.arrivals) > events // 2  # streamed, not delivered in one piece at the end
    assert r.arrivals[0] < r.arrivals[-1] - 0.3


def test_a_gzip_sse_stream_is_decoded_and_scrubbed_per_read(env: Env) -> None:
    r = _Target(env, None).fetch(
        "GET", "/echo?sse=1&enc=gzip", {"Authorization": f"Bearer {env.placeholder}"}
    )
    assert (r.status, r.ok) == (200, True)
    assert _leaks(env, r.body) == []
    assert f"data: Bearer {env.placeholder}\n\n".encode() in r.body
    assert len(r.arrivals) > r.body.count(b"\n\n") // 2


@pytest.mark.parametrize(
    ("enc", "bomb"),
    [("gzip", 1), ("br", 1), ("zstd", 1), ("compress", 0), ("x-unknown", 0)],
    ids=["gzip-bomb", "br-bomb", "zstd-bomb", "no-decoder-compress", "no-decoder-unknown"],
)
def test_a_body_that_cannot_be_scanned_closes_the_connection_and_is_audited(
    env: Env, target: _Target, enc: str, bomb: int
) -> None:
    path = f"/echo?enc={enc}&bomb={bomb}&unscannable_{enc}_{target.h2 is not None}=1"
    r = target.fetch("GET", path, {"Authorization": f"Bearer {env.placeholder}"})
    assert not r.ok  # cut, never ended normally
    assert len(r.body) < (1 << 20)
    audited = (
        path.split("?")[0]
        + "?"
        + "&".join(p.split("=")[0] + "=REDACTED" for p in path.split("?")[1].split("&"))
    )
    event = env.proxy.wait_event(path=audited, timeout=30)
    assert event["reason"] == "unscannable_response"
    assert "cannot be scanned" in event["message"]
    assert ("more than" in event["message"]) if bomb else ("no decoder" in event["message"])


def test_a_replaced_value_is_still_scrubbed(env: Env) -> None:
    """After the credential file is rotated, the old value may still be valid upstream: an echo of
    it comes back as the placeholder too (proxy.store.live). Runs last: it rotates the module's secret."""
    old, new = env.secret, f"CANARYnew{secrets.token_hex(12)}"
    env.more_canaries.append(new)
    target = _Target(env, None)
    target.fetch("GET", "/echo?before=1", {"Authorization": f"Bearer {env.placeholder}"})  # reads the old
    env.secret_file.write_text(new + "\n")
    r = target.fetch("POST", "/echo?after=1", {"Authorization": f"Bearer {env.placeholder}"}, old.encode())
    assert (r.status, r.ok) == (200, True)
    assert _leaks(env, r.head + r.body) == []
    assert r.body.count(env.placeholder.encode()) >= 3  # the old value (body) and the new (header)
    [rec] = [x for x in env.upstream.requests if x.path == "/echo?after=1"]
    assert ("Authorization", f"Bearer {new}") in rec.headers
