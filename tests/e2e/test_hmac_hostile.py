"""End to end: a hostile sandbox against credentials of kind ``hmac`` (issue 15; review r-sign2).
A real proxy process, the real loopback upstream of tests/e2e/_authserver.py (it verifies the
example scheme with the real secret and records every request target and head it gets), httpx
as the sandbox over HTTP/1.1 and HTTP/2.

- an HTTP/2 request without ``Content-Length`` on a method that usually has no body (GET, HEAD,
  OPTIONS, DELETE) that still carries DATA: before, mitmproxy buffered it (up to its
  ``stream_large_bodies``, 1 MiB, past any ``max_body``) and past 1 MiB started streaming it,
  sending the head upstream before ``request`` had signed it, with the sandbox's own
  ``X-Signature``; now it is signed over the empty body in ``requestheaders`` and its first DATA
  byte closes both connections: nothing is buffered and the upstream never gets a whole request;
- the same request without DATA (what every HTTP/2 client sends for a GET) is signed and accepted;
- a signature that does not cover the body was set in ``request``, after a streamed body had
  sent the head: the head left unsigned; now it is signed in ``requestheaders``;
- ``X-Signature`` / ``X-Timestamp`` the sandbox pre-sets, in any case and repeated, are replaced:
  the upstream sees exactly one of each, surrogate's.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from _authserver import AuthServer
from harness import ProxyProcess
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

PH = "surr_HmacHostilePlaceholder00001"
PH_NOBODY = "surr_HmacNobodyPlaceholder000001"
MIB = 1024 * 1024


class _H2First(ssl.SSLContext):
    """ALPN ``h2`` first, as curl offers it (mitmproxy takes the client's first choice; httpcore
    offers http/1.1 first): tests/e2e/test_surfaces.py."""

    def set_alpn_protocols(self, alpn_protocols: Any) -> None:
        super().set_alpn_protocols(["h2", "http/1.1"])


@dataclass
class World:
    stage: Stage
    proxy: ProxyProcess
    token: str
    server: AuthServer
    nobody: AuthServer  # nobody.test: its credential's signature does not cover the body

    def client(self, http2: bool = False) -> httpx.Client:
        verify = _H2First(ssl.PROTOCOL_TLS_CLIENT) if http2 else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        verify.load_verify_locations(cafile=str(self.proxy.ca_pem))
        return httpx.Client(
            proxy=self.proxy.url("c1", self.token), verify=verify, timeout=30, trust_env=False, http2=http2
        )

    def url(self, path: str, host: str = "sig.test") -> str:
        port = self.server.port if host == "sig.test" else self.nobody.port
        return f"https://{host}:{port}{path}"

    def keep(self, r: httpx.Response) -> httpx.Response:
        self.stage.received.append(json.dumps(list(r.headers.multi_items())).encode() + r.content)
        return r

    def audit(self, path: str) -> list[dict[str, object]]:
        lines = self.proxy.audit_path.read_text().splitlines()
        events = map(json.loads, filter(str.strip, lines))
        return [e for e in events if str(e.get("path")).partition("?")[0] == path]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("hmachostile")) as st:
        token = st.token()
        server = AuthServer(st.ca, ["sig.test"], "unused")
        server.hmac_secret = st.secret("sig")
        st.serve(server)
        nobody = AuthServer(st.ca, ["nobody.test"], "unused")
        nobody.hmac_secret, nobody.hmac_signs_body = st.secret("nobody"), False
        st.serve(nobody)
        creds = [
            credential("sig", PH, ["sig.test"], kind="hmac", sign={"max_body": 4096}),
            credential("nobody", PH_NOBODY, ["nobody.test"], kind="hmac",
                       sign={"parts": ["timestamp", "method", "path", "query"]}),
        ]  # fmt: skip
        text = rules([egress("sig.test", server.port), egress("nobody.test", nobody.port)], credentials=creds)
        yield World(st, st.proxy(text, ["sig.test", "nobody.test"]), token, server, nobody)


def _body(total: int) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(65536, total - sent)
        sent += n
        yield b"x" * n


@pytest.mark.parametrize("method", ["GET", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("size", [5000, 3 * MIB // 2], ids=["past-max-body", "past-stream-large-bodies"])
def test_an_http2_body_without_content_length_on_a_bodiless_method_never_reaches_the_upstream(
    world: World, method: str, size: int
) -> None:
    path = f"/hmac/h2-undeclared-{method.lower()}-{size}"
    with world.client(http2=True) as c:
        try:
            r = world.keep(c.request(method, world.url(path), content=_body(size)))
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            pass  # closed: the request head had left (signed over the empty body), no answer fits
        else:
            assert r.status_code in (411, 413), r.status_code
    assert path not in world.server.paths  # the upstream never got a whole request
    deadline = time.monotonic() + 10  # the event is written when the closed flow ends
    while not any(e.get("reason") == "bad_request_body" for e in world.audit(path)):
        assert time.monotonic() < deadline, world.audit(path)
        time.sleep(0.1)


@pytest.mark.parametrize("method", ["GET", "DELETE", "OPTIONS", "HEAD"])
def test_an_http2_request_without_a_body_is_signed_and_accepted(world: World, method: str) -> None:
    path = f"/hmac/h2-plain-{method.lower()}?a=1"
    with world.client(http2=True) as c:
        r = world.keep(c.request(method, world.url(path)))
    assert r.http_version == "HTTP/2"
    if method == "GET":
        assert r.status_code == 200 and r.json()["ok"] is True, r.text
    else:  # _authserver's http.server answers 501 to a method it has no handler for: reached
        assert r.status_code == 501, r.status_code
    (event,) = world.audit(path.partition("?")[0])
    assert {"name": "sig", "version": 1, "applied": "hmac_signed"} in event["credentials"]  # type: ignore[operator]


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_a_signature_the_sandbox_presets_is_replaced_whatever_its_spelling(world: World, http2: bool) -> None:
    path = f"/hmac/preset-{int(http2)}"
    headers = [
        ("X-Signature", "0" * 64), ("x-signature", "1" * 64), ("X-SIGNATURE", PH),
        ("X-Timestamp", "1"), ("x-timestamp", "2"),
    ]  # fmt: skip
    with world.client(http2=http2) as c:
        r = world.keep(c.get(world.url(path), headers=headers))
    assert r.status_code == 200 and r.json()["ok"] is True
    seen = world.server.heads[path]
    assert len([v for k, v in seen if k.lower() == "x-signature"]) == 1
    assert len([v for k, v in seen if k.lower() == "x-timestamp"]) == 1


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
@pytest.mark.parametrize("size", [10, 3 * MIB], ids=["small", "3mib"])
def test_a_signature_that_does_not_cover_the_body_is_in_the_head_of_a_streamed_body(
    world: World, http2: bool, size: int
) -> None:
    """Before: signed in ``request``, which runs after a streamed body, so the head had left
    unsigned (the upstream answered 401)."""
    path = f"/hmac/nobody-{int(http2)}-{size}?x=1"
    with world.client(http2=http2) as c:
        r = world.keep(c.post(world.url(path, "nobody.test"), content=b"y" * size))
    assert r.status_code == 200 and r.json() == {"ok": True, "len": size}, r.text
