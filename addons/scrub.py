"""scrub: secret → placeholder in responses, streaming.

For a claim that holds credentials, every live value of each credential (current and recently
replaced, :mod:`proxy.live`) is replaced by its
placeholder in response header values and bodies, raw or percent-, JSON- or base64-escaped
(:class:`proxy.scrub.Scrubber` lists the forms; a secret split across reads is caught; only a
tail that could start a secret is held back, so an SSE event is not delayed to the next read).
Requests of such claims ask for ``Accept-Encoding: identity``; a
body that is compressed anyway is decoded on the fly (gzip, deflate, br) and sent decoded, and
one in an encoding that cannot be decoded is refused (the connection is closed: it cannot be
scanned). A scrubbed body changes length, so ``Content-Length`` is dropped (HTTP/1 clients get
chunked framing). WebSocket upgrades (101) are not scrubbed here.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import brotli  # type: ignore[import-untyped]  # mitmproxy depends on it; no stubs
from mitmproxy import http

from addons import facts
from proxy.live import live_values
from proxy.policy import Claim
from proxy.scrub import Scrubber


def _pairs(claim: Claim, now: float) -> list[tuple[bytes, bytes]]:
    """Every live value of every credential (proxy.live), each with its credential's placeholder."""
    return [
        (secret.reveal().encode(), c.placeholder.encode())
        for c in claim.credentials
        for secret in live_values(c, now)
    ]


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    if encoding in ("", "identity"):
        return lambda b: b
    if encoding in ("gzip", "x-gzip", "deflate"):
        d: Any = zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib or gzip header, detected
        return lambda b: d.decompress(b) if b else d.flush()
    if encoding == "br":
        b_: Any = brotli.Decompressor()
        return lambda b: b_.process(b) if b else b""
    return None


class Scrub:
    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata.get(facts.CLAIM)
        if claim is not None and claim.credentials and "accept-encoding" in flow.request.headers:
            flow.request.headers["Accept-Encoding"] = "identity"

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        claim = flow.metadata.get(facts.CLAIM)
        if response is None or claim is None or not claim.credentials or response.status_code == 101:
            return
        scrubber = Scrubber(_pairs(claim, time.time()))
        if not scrubber.active:
            return
        response.headers.fields = tuple((n, scrubber.scrub(v)) for n, v in response.headers.fields)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        decode = _decoder(encoding)
        if decode is None:
            facts.log.warning("response in %r cannot be scanned for secrets; connection closed", encoding)
            flow.kill()
            return
        if encoding not in ("", "identity"):
            del response.headers["content-encoding"]
        response.headers.pop("content-length", None)
        if not flow.request.http_version.startswith("HTTP/2") and not flow.request.http_version.startswith(
            "HTTP/3"
        ):
            response.headers["transfer-encoding"] = "chunked"
        inner = response.stream if callable(response.stream) else (lambda b: b)

        def scrub(chunk: bytes) -> list[bytes]:
            got = inner(chunk)
            raw = got if isinstance(got, bytes) else b"".join(got)
            data = decode(raw) if raw else decode(b"")
            out = scrubber.feed(data) if data else b""
            if not chunk:  # end of the body: what was held back, scrubbed
                out += scrubber.finish()
            # never an empty piece: an empty chunk would end a chunked HTTP/1 body early
            return [out] if out else []

        response.stream = scrub
