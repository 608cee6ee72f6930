"""Review r-perf: scrubbing with upstream reads of up to 256 KiB (proxy/engine/reads.py) and the
cheaper escape search (proxy/core/scrub.py, scrubmatch.py; issue 19), through a real proxy.

A hostile upstream (a raw TLS server, so it decides where every TCP write ends) sends a
response whose body holds the claim's secret in one spelling (raw, percent-escaped, JSON
``\\u``-escaped, base64, and mixes of escaped and plain characters) after a padding that puts it
at mitmproxy's old 64 KiB read boundary and the new 256 KiB one, cut by a pause at every offset
inside the spelling (so the proxy reads the two halves separately), or written in one piece;
the padding is plain, or an API's JSON dense in escapes (the escape finder's dense path).
Text and binary content types (binary bodies are searched for the plain spellings only). The
sandbox must never receive a spelling of the secret (tests/canary.py's forms)."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import canary
import httpx
import pytest
from harness import free_port
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_ScrubReadsPlaceholder000001"


@dataclass
class Hostile:
    """A TLS upstream on 127.0.0.1: ``GET /?pad=N&form=F&cut=K&ctype=T`` answers ``N`` padding
    bytes, the secret spelled as ``form``, 100 tail bytes; a 150 ms pause after ``cut`` bytes of
    the spelling (``cut=-1``: the whole body in one write)."""

    ctx: ssl.SSLContext
    secret: bytes
    port: int = field(default_factory=free_port)
    sock: socket.socket | None = None

    def start(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def _accept(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as s:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = s.recv(65536)
                        if not chunk:
                            return
                        head += chunk
                    self._answer(s, head.split(b" ", 2)[1].decode())
        except (OSError, ssl.SSLError):
            return

    def _answer(self, s: ssl.SSLSocket, target: str) -> None:
        q = {k: v[0] for k, v in parse_qs(urlsplit(target).query).items()}
        pad, cut = int(q["pad"]), int(q["cut"])
        spelled = spell(self.secret, q["form"])
        body = padding(pad, q.get("noise", "a")) + spelled + b"z" * 100
        head = f"HTTP/1.1 200 OK\r\nContent-Type: {q['ctype']}\r\nContent-Length: {len(body)}\r\n\r\n"
        s.sendall(head.encode())
        if cut < 0:
            s.sendall(body)
            return
        s.sendall(body[: pad + cut])
        time.sleep(0.15)
        s.sendall(body[pad + cut :])


# an API's JSON record: escapes of bytes the secret's spellings do not hold (\u00e9, \", \n, %3A),
# which the escape finder skips in C, beside ones it must look at (%41, \u0042)
JSON_NOISE = b'{"t": "caf\\u00e9 \\"q\\" \\n", "u": "/q?is%3Aopen", "x": "%41\\u0042"}, '


HEADS = {"percent": b'"50%', "backslash-u": b"\\u00", "percent-digit": b"%4"}


def padding(pad: int, noise: str) -> bytes:
    """``pad`` bytes: "a"s, or (``noise=json``) whole JSON_NOISE records then "a"s, so no escape
    is left open against the spelling that follows."""
    if noise == "a":
        return b"a" * pad
    if noise in HEADS:  # text that ends like an escape's head, right before the spelling
        return b"a" * (pad - len(HEADS[noise])) + HEADS[noise]
    records = JSON_NOISE * (pad // len(JSON_NOISE))
    return records + b"a" * (pad - len(records))


def spell(secret: bytes, form: str) -> bytes:
    if form == "raw":
        return secret
    if form == "percent":
        return "".join(f"%{b:02X}" for b in secret).encode()
    if form == "json":
        return "".join(f"\\u{b:04x}" for b in secret).encode()
    if form == "mixed":  # every other character escaped, percent and JSON in turn
        out = []
        for i, b in enumerate(secret):
            out.append(bytes([b]) if i % 2 else (f"%{b:02x}" if i % 4 else f"\\u{b:04X}").encode())
        return b"".join(out)
    if form == "late":  # plain first characters (a canary starts with the hex digits "CA"), one escaped
        return secret[:3] + f"\\u{secret[3]:04x}".encode() + secret[4:]
    if form == "base64":
        return base64.b64encode(secret)
    if form == "basic":  # inside a longer base64 run, as in Basic credentials
        return base64.b64encode(b"user:" + secret + b":more")
    raise AssertionError(form)


@dataclass
class World:
    stage: Stage
    hostile: Hostile
    client: httpx.Client


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("scrubreads")) as st:
        token, secret = st.token(), st.secret("api")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        st.ca.ca.issue_cert("api.test").configure_cert(ctx)
        hostile = st.serve(Hostile(ctx, secret.encode()))
        text = rules(
            [egress("api.test", hostile.port)], claims=[claim("c1", [credential("api", PH, ["api.test"])])]
        )
        proxy = st.proxy(text, resolve=["api.test"])
        verify = ssl.create_default_context(cafile=str(proxy.ca_pem))
        with httpx.Client(proxy=proxy.url("c1", token), verify=verify, timeout=30) as client:
            yield World(st, hostile, client)


FORMS = ["raw", "percent", "json", "mixed", "base64", "basic"]
PLAIN = {"raw", "base64", "basic"}  # what a binary body is searched for
PADS = [65535 - 7, 65536 + 3, 262144 - 11, 262144 + 5]


def _get(w: World, pad: int, form: str, cut: int, ctype: str, noise: str = "a") -> bytes:
    url = f"https://api.test:{w.hostile.port}/?pad={pad}&form={form}&cut={cut}&ctype={ctype}&noise={noise}"
    got = w.client.get(url)
    w.stage.received.append(got.content)
    assert got.status_code == 200, got.text[:200]
    return got.content


@pytest.mark.parametrize("ctype", ["text/plain", "application/octet-stream"])
@pytest.mark.parametrize("form", FORMS)
def test_a_secret_cut_at_every_offset_by_a_pause_is_never_received(
    world: World, form: str, ctype: str
) -> None:
    if ctype != "text/plain" and form not in PLAIN:
        pytest.skip("binary bodies are searched for the plain spellings only (scrubforms.escapes_matter)")
    spelled = spell(world.hostile.secret, form)
    for cut in range(1, len(spelled), max(1, len(spelled) // 12)):
        body = _get(world, 40, form, cut, ctype)
        assert canary.find(body, [world.hostile.secret.decode()]) == [], (form, cut)
        assert spelled not in body
        if form == "raw":
            assert PH.encode() in body  # replaced, not cut off


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("form", FORMS)
def test_a_secret_at_the_64k_and_256k_read_boundaries_is_never_received(
    world: World, form: str, pad: int
) -> None:
    spelled = spell(world.hostile.secret, form)
    for cut in (-1, 1, len(spelled) // 2, len(spelled) - 1):
        body = _get(world, pad, form, cut, "text/plain")
        assert len(body) >= pad
        assert canary.find(body, [world.hostile.secret.decode()]) == [], (form, pad, cut)
        assert spelled not in body
        if form == "raw":
            assert PH.encode() in body


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("form", FORMS)
def test_a_secret_after_json_dense_in_escapes_at_the_read_boundaries_is_never_received(
    world: World, form: str, pad: int
) -> None:
    """The same after an API's JSON (thousands of escapes per read, so the escape finder's dense
    path with its head regexes runs; issue 19), as application/json."""
    spelled = spell(world.hostile.secret, form)
    for cut in (-1, 1, len(spelled) // 2, len(spelled) - 1):
        body = _get(world, pad, form, cut, "application/json", noise="json")
        assert body.count(JSON_NOISE) == pad // len(JSON_NOISE)  # the noise passed unchanged
        assert canary.find(body, [world.hostile.secret.decode()]) == [], (form, pad, cut)
        assert spelled not in body
        if form == "raw":
            assert PH.encode() in body


@pytest.mark.parametrize("ctype", ["application/json", "text/plain"])
@pytest.mark.parametrize("noise", list(HEADS))
def test_a_literal_percent_before_a_secret_escaped_past_its_first_characters_is_never_received(
    world: World, noise: str, ctype: str
) -> None:
    """A JSON value ``"50%CAN\\u0041RY…"``: the ``%`` is text, but decoding read ``%CA`` as
    one byte and the rest no longer spelled the secret, which came back whole (an attack
    session, through the proxy: ``50%ab\\u0063defgh``). Also after ``\\u00`` and ``%4``, whole
    and cut by a pause at each offset of the spelling's first bytes."""
    spelled = spell(world.hostile.secret, "late")
    for cut in (-1, 1, 2, 3, 4, 8, len(spelled) - 1):
        body = _get(world, 200, "late", cut, ctype, noise=noise)
        assert spelled not in body and spelled[3:] not in body, (noise, cut, body[190:300])
        assert body.count(PH.encode()) == 1, (noise, cut, body[190:300])
        assert body.startswith(padding(200, noise)), (noise, cut)
