"""A real HTTPS upstream that speaks HTTP/2 and HTTP/1.1 (hypercorn, test CA), for the
substitution tests: it records each request (target, header fields, body length, SHA-256 of the
body as received and as decoded from its Content-Encoding) and answers only with sizes and
digests, never a value it received, so nothing it echoes can carry a secret back.

``h2=False`` offers only ``http/1.1`` in ALPN, so an HTTP/2 client meets an HTTP/1 upstream.
"""

from __future__ import annotations

import hashlib
import json
import threading
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import brotli  # type: ignore[import-untyped]
import trustme
from backports import zstd
from hypercorn_server import HypercornServer

Scope = dict[str, Any]
Message = dict[str, Any]


@dataclass
class Seen:
    method: str
    target: str  # path and query as received (raw)
    http_version: str
    headers: list[tuple[str, str]]
    body_len: int
    body_sha256: str  # of the bytes received
    decoded_sha256: str  # of the body decoded from its Content-Encoding (gzip, deflate, br, zstd)
    decoded: bytes | None  # the decoded body when small (<= 64 KiB), for content checks
    complete: bool  # the whole body arrived (the client did not disconnect mid-body)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def _decompressor(encoding: str) -> Callable[[bytes], bytes] | None:
    """The libraries' own decoders (gzip/deflate: zlib, br: brotli, zstd: backports.zstd)."""
    if encoding in ("gzip", "deflate"):
        return zlib.decompressobj(32 + zlib.MAX_WBITS).decompress
    if encoding == "br":
        return brotli.Decompressor().process  # type: ignore[no-any-return]
    if encoding == "zstd":
        return zstd.ZstdDecompressor().decompress  # type: ignore[no-any-return]
    return None


class AsgiUpstream(HypercornServer):
    def __init__(self, ca: trustme.CA, hostnames: list[str], tmpdir: Path, h2: bool = True) -> None:
        pem = tmpdir / f"asgi-upstream-{'h2' if h2 else 'h1'}.pem"
        ca.issue_cert(*hostnames).private_key_and_cert_chain_pem.write_to_path(str(pem))
        super().__init__(pem, pem, ["h2", "http/1.1"] if h2 else ["http/1.1"], "asgi-upstream")
        self.seen: list[Seen] = []
        self._lock = threading.Lock()

    def last(self, path_prefix: str) -> Seen:
        with self._lock:
            found = [s for s in self.seen if s.target.startswith(path_prefix)]
        assert found, f"upstream saw no request to {path_prefix}"
        return found[-1]

    def saw(self, path_prefix: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.target.startswith(path_prefix)]

    async def _app(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        encoding = next((v for k, v in headers if k.lower() == "content-encoding"), "").lower()
        inflate = _decompressor(encoding)
        raw, decoded, n, small = hashlib.sha256(), hashlib.sha256(), 0, bytearray()
        complete = False
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                break
            body = msg.get("body", b"")
            raw.update(body)
            n += len(body)
            plain = inflate(body) if inflate and body else body
            decoded.update(plain)
            if len(small) + len(plain) <= 64 * 1024:
                small += plain
            if not msg.get("more_body"):
                complete = True
                break
        target = scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        seen = Seen(
            scope["method"], target, scope["http_version"], headers, n, raw.hexdigest(), decoded.hexdigest(),
            bytes(small) if n <= 64 * 1024 or inflate else None, complete,
        )  # fmt: skip
        with self._lock:
            self.seen.append(seen)
        if not complete:
            return
        out = json.dumps({"received": n, "sha256": raw.hexdigest(), "http_version": scope["http_version"]})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": out.encode()})
