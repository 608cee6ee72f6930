"""End to end: the body bytes an upstream receives always match the framing the head declared.

Issue 20 item 2: a compressed request body toward a host where a refusing credential
(``on_misplaced: block``) could be misplaced was decoded, checked and re-encoded, but sent with
the client's ``Content-Length``; the upstream could not decode it, and its leftover bytes became
the start of the next request on that connection. The class: any body whose bytes differ from
what the head announced, in every coding (identity, gzip, deflate, br, zstd), from HTTP/1.1 and
HTTP/2 clients, to HTTP/1.1 and HTTP/2 upstreams, with and without a swap; and an HTTP/2
request whose head announced no length going to an HTTP/1 upstream (its body would otherwise
be read as the next request there).

The HTTP/1 upstream is a raw socket server (tests/raw_upstream.py) that keeps every byte it
received and parses them with h11; the HTTP/2 one is hypercorn (tests/asgi_upstream.py).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import secrets
import socket
import ssl
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import brotli  # type: ignore[import-untyped]
import httpx
import pytest
from asgi_upstream import AsgiUpstream
from backports import zstd
from harness import ProxyProcess
from raw_upstream import RawUpstream
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e

NAMES = ["raw.test", "h2.test"]
P_BLK = "surr_FramingBlockPlaceholder01"  # header only, on_misplaced: block
P_SVC = "surr_FramingSwapPlaceholder002"  # header and body: swapped in bodies

CODECS: dict[str, Callable[[bytes], bytes]] = {
    "identity": lambda b: b,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstd.compress(b),
}


class _H2First(ssl.SSLContext):
    """Offer h2 first (httpcore offers http/1.1 first, and mitmproxy takes the client's first)."""

    def set_alpn_protocols(self, alpn_protocols: Any) -> None:
        super().set_alpn_protocols(["h2", "http/1.1"])


@dataclass
class Env:
    raw: RawUpstream
    h2: AsgiUpstream
    proxy: ProxyProcess
    token: str
    secret: str
    received: list[bytes] = field(default_factory=list)

    def client(self, claim: str, http2: bool) -> httpx.Client:
        ctx = _H2First(ssl.PROTOCOL_TLS_CLIENT) if http2 else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=self.proxy.ca_pem)
        return httpx.Client(proxy=self.proxy.url(claim, self.token), verify=ctx, http2=http2, timeout=15)

    def url(self, host: str, path: str) -> str:
        port = self.raw.port if host == "raw.test" else self.h2.port
        return f"https://{host}:{port}{path}"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with Stage(tmp_path_factory.mktemp("framing")) as st:
        secret, token = st.secret("svc", tag="framing", file="secret"), st.token(secrets.token_urlsafe(16))
        st.secret("blk", tag="framingblk")
        raw = st.enter(RawUpstream(st.ca.ca, NAMES))
        h2 = st.serve(AsgiUpstream(st.ca.ca, NAMES, st.tmp, h2=True))
        both = ["raw.test", "h2.test"]
        text = rules(
            [egress("raw.test", raw.port), egress("h2.test", h2.port)],
            claims=[
                claim("blk", [credential("blk", P_BLK, both, surfaces=["header"], on_misplaced="block")]),
                claim("swp", [credential("svc", P_SVC, both, "file:secret", surfaces=["header", "body"])]),
                claim("bare"),
            ],
        )
        yield Env(raw, h2, st.proxy(text, NAMES), token, secret, st.received)


def _decode(encoding: str, data: bytes) -> bytes:
    if encoding in ("gzip", "deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS).decompress(data)
    if encoding == "br":
        return brotli.decompress(data)  # type: ignore[no-any-return]
    if encoding == "zstd":
        return zstd.decompress(data)
    return data


def _post(env: Env, claim: str, http2: bool, url: str, **kw: Any) -> httpx.Response:
    with env.client(claim, http2) as client:
        r = client.post(url, **kw)
    env.received.append(r.content + str(r.headers).encode())
    assert r.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    return r


def _one_clean_request(env: Env, path: str) -> Any:
    """The one request the raw upstream got for ``path``: whole, alone on its connection, and
    no byte of it left over for a next request."""
    [conn] = env.raw.connections(path)
    assert conn.error is None, f"upstream connection desynchronised: {conn.error}"
    assert [r.target for r in conn.requests] == [path], "leftover bytes were read as another request"
    [req] = conn.requests
    assert req.complete
    length = req.header("content-length")
    chunked = (req.header("transfer-encoding") or "").lower() == "chunked"
    assert chunked != (length is not None), "exactly one of Content-Length and chunked"
    assert length is None or int(length) == len(req.body)
    return req


PROTOCOLS = [pytest.param(False, id="http1.1"), pytest.param(True, id="http2")]
CASES = [
    pytest.param("blk", False, id="refusing-credential-no-swap"),
    pytest.param("swp", False, id="swappable-but-absent"),
    pytest.param("swp", True, id="swapped"),
]


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("encoding", list(CODECS))
@pytest.mark.parametrize(("claim", "swapped"), CASES)
def test_a_request_body_toward_an_http1_upstream_matches_its_framing(
    env: Env, http2: bool, encoding: str, claim: str, swapped: bool
) -> None:
    path = f"/h1/{claim}/{int(swapped)}/{encoding}/{int(http2)}"
    doc = {"pad": "x" * 100_000, "token": P_SVC if swapped else "none", "n": path}
    sent = CODECS[encoding](json.dumps(doc).encode())
    headers = {"Content-Type": "application/json"}
    if encoding != "identity":
        headers["Content-Encoding"] = encoding
    r = _post(env, claim, http2, env.url("raw.test", path), content=sent, headers=headers)
    assert r.status_code == 200 and r.content == b"ok"
    req = _one_clean_request(env, path)
    if claim == "blk":
        # nothing could be swapped: the client's own bytes, under the client's own length
        assert req.body == sent and req.header("content-length") == str(len(sent))
    expected = {**doc, "token": env.secret} if swapped else doc
    assert json.loads(_decode(encoding, req.body)) == expected


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("encoding", list(CODECS))
@pytest.mark.parametrize(("claim", "swapped"), CASES)
def test_a_request_body_toward_an_http2_upstream_matches_its_framing(
    env: Env, http2: bool, encoding: str, claim: str, swapped: bool
) -> None:
    path = f"/h2/{claim}/{int(swapped)}/{encoding}/{int(http2)}"
    doc = {"pad": "x" * 100_000, "token": P_SVC if swapped else "none", "n": path}
    sent = CODECS[encoding](json.dumps(doc).encode())
    headers = {"Content-Type": "application/json"}
    if encoding != "identity":
        headers["Content-Encoding"] = encoding
    r = _post(env, claim, http2, env.url("h2.test", path), content=sent, headers=headers)
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.complete and seen.http_version == ("2" if http2 else "1.1")
    assert seen.header("content-length") in (None, str(seen.body_len))
    if claim == "blk":
        assert seen.body_sha256 == hashlib.sha256(sent).hexdigest()
    expected = {**doc, "token": env.secret} if swapped else doc
    assert seen.decoded_sha256 == hashlib.sha256(json.dumps(expected).encode()).hexdigest()


SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: raw.test\r\n\r\n"


@pytest.mark.parametrize("claim", ["bare", "blk", "swp"])
@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_an_http2_body_without_a_length_is_never_read_as_a_request_by_an_http1_upstream(
    env: Env, claim: str, method: str
) -> None:
    """HTTP/2 frames a body with END_STREAM, HTTP/1 needs Content-Length or chunked: a body
    written after a head that announced none would be the next request on that connection."""
    path = f"/downgrade/{claim}/{method}"

    def body() -> Iterator[bytes]:  # a generator: httpx sends no Content-Length
        yield SMUGGLED

    with env.client(claim, True) as client:
        r = client.request(method, env.url("raw.test", path), content=body())
    env.received.append(r.content)
    assert r.status_code == 200 and r.http_version == "HTTP/2"
    req = _one_clean_request(env, path)
    assert req.body == SMUGGLED
    assert env.raw.requests("/smuggled") == []


def test_every_upstream_connection_of_this_module_stayed_in_step(env: Env) -> None:
    """Runs last: no connection to the raw upstream ever held bytes it could not parse."""
    assert [c.error for c in env.raw.streams if c.error] == []
    assert env.raw.requests("/smuggled") == []


def test_the_audit_file_holds_no_secret(env: Env) -> None:
    assert env.secret not in Path(env.proxy.audit_path).read_text()


def test_a_compressed_body_that_stalls_mid_placeholder_is_refused_not_held(env: Env) -> None:
    """Check only: the client's bytes are held while the decoded tail may still become a
    placeholder. 1.25 MB of empty deflate blocks after ``surr_Fr`` decode to nothing: past the
    1 MiB hold the body is refused (the connection closes) instead of held without bound."""
    path = "/stall"
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [z.compress(b'{"k": "surr_Fr') + z.flush(zlib.Z_SYNC_FLUSH)]
    parts += [b"\x00\x00\x00\xff\xff"] * 250_000  # empty stored blocks (RFC 1951 §3.2.4), byte-aligned
    parts.append(z.compress(b'amingBlock"}') + z.flush())
    sent = b"".join(parts)
    assert len(sent) > 1024 * 1024
    with env.client("blk", False) as client, pytest.raises(httpx.HTTPError):
        client.post(
            env.url("raw.test", path),
            content=sent,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
    event = env.proxy.wait_event(path=path)
    assert (event["reason"], event["status"]) == ("bad_request_body", None)
    assert all(not r.complete for r in env.raw.requests(path))


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_a_refused_placeholder_in_a_compressed_body_still_closes_the_connection(
    env: Env, http2: bool, encoding: str
) -> None:
    """Forwarding the client's own bytes does not let a refused placeholder through: the
    compressed read holding it is checked before it leaves, and the upstream never gets the
    whole request."""
    path = f"/refused-coded/{encoding}/{int(http2)}"
    sent = CODECS[encoding](json.dumps({"k": P_BLK, "pad": "y" * 1000}).encode())
    with env.client("blk", http2) as client, pytest.raises(httpx.HTTPError):
        client.post(
            env.url("raw.test", path),
            content=sent,
            headers={"Content-Type": "application/json", "Content-Encoding": encoding},
        )
    event = env.proxy.wait_event(path=path)
    assert (event["reason"], event["violation_surface"]) == ("placeholder_misplaced", "body")
    assert all(not r.complete for r in env.raw.requests(path))


# r2 review: only the first gzip member was decoded (RFC 1952 §2.2 allows a series of them, and
# the upstream's decoder reads them all): a placeholder in the second passed unchecked, and a
# swapped body lost everything after the first member.
def _two_members(first: dict[str, str], second: dict[str, str]) -> bytes:
    text = json.dumps({**first, **second}).encode()
    cut = text.index(b'"second"')
    return gzip.compress(text[:cut]) + gzip.compress(text[cut:])


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_a_refused_placeholder_in_a_second_gzip_member_closes_the_connection(env: Env, http2: bool) -> None:
    path = f"/members-refused/{int(http2)}"
    sent = _two_members({"pad": "y" * 1000}, {"second": P_BLK})
    assert P_BLK.encode() in gzip.decompress(sent)
    with env.client("blk", http2) as client, pytest.raises(httpx.HTTPError):
        client.post(
            env.url("raw.test", path),
            content=sent,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
    event = env.proxy.wait_event(path=path)
    assert (event["reason"], event["violation_surface"]) == ("placeholder_misplaced", "body")
    assert all(not r.complete for r in env.raw.requests(path))


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_a_placeholder_in_a_second_gzip_member_is_swapped_and_nothing_is_lost(env: Env, http2: bool) -> None:
    path = f"/members-swapped/{int(http2)}"
    doc = {"pad": "z" * 1000, "second": P_SVC, "n": path}
    sent = _two_members({"pad": doc["pad"]}, {"second": P_SVC, "n": path})
    r = _post(
        env,
        "swp",
        http2,
        env.url("raw.test", path),
        content=sent,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200
    req = _one_clean_request(env, path)
    assert json.loads(_decode("gzip", req.body)) == {**doc, "second": env.secret}


def _raw_tunnel(env: Env, claim: str, host: str) -> ssl.SSLSocket:
    port = env.raw.port if host == "raw.test" else env.h2.port
    raw = socket.create_connection(("127.0.0.1", env.proxy.port), timeout=10)
    auth = base64.b64encode(f"{claim}:{env.token}".encode()).decode()
    connect = f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    raw.sendall(f"{connect}Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=str(env.proxy.ca_pem))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx.wrap_socket(raw, server_hostname=host)


def test_an_http10_body_whose_length_changed_goes_upstream_as_http11_chunked(env: Env) -> None:
    """r2 review: the swap re-frames the body as chunked, and an HTTP/1.0 request went upstream as
    ``HTTP/1.0`` with ``Transfer-Encoding: chunked``, which RFC 9112 §6.1 has a recipient treat as
    faulty framing (nginx refuses it; a server that reads the body by its absent length takes
    the chunks for the next request). A proxy sends its own version (RFC 9110 §2.5)."""
    path = "/http10/swapped"
    body = json.dumps({"t": P_SVC, "n": path}).encode()
    head = f"POST {path} HTTP/1.0\r\nHost: raw.test:{env.raw.port}\r\nContent-Type: application/json\r\n"
    with _raw_tunnel(env, "swp", "raw.test") as tls:
        tls.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = b""
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            while chunk := tls.recv(65536):
                data += chunk
    env.received.append(data)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    req = _one_clean_request(env, path)
    [conn] = env.raw.connections(path)
    assert bytes(conn.data).startswith(f"POST {path} HTTP/1.1\r\n".encode())
    assert json.loads(req.body) == {"t": env.secret, "n": path}
