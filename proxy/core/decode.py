"""Bounded, streaming decoding of compressed response bodies, so that they can be scrubbed.

A response body in ``gzip`` (also ``x-gzip``), ``deflate`` (zlib-wrapped, or raw as some servers
send it), ``br`` or ``zstd`` (RFC 9110 §8.4.1; RFC 7932; RFC 8878) is decoded one read at a time,
each read's output produced in steps of :data:`STEP` bytes, so a decompression bomb is stopped
before it is held in memory:

- one read may decode to at most :data:`READ_LIMIT` bytes (memory held at once);
- the whole body may decode to at most ``max(FLOOR, RATIO × compressed bytes so far)``: text
  compresses 3-20×, a bomb by 1000× (gzip) to millions (brotli, zstd).

Concatenated gzip members and zstd frames are decoded in turn (RFC 1952 §2.2; RFC 8878 §3.1).
``identity`` passes through. Anything else (several codings stacked, ``compress``, an unknown
token) has no decoder: :func:`decoder` returns None and the body cannot be scanned.

Raises :class:`Unscannable` (with a message naming the coding and the bound, never body bytes)
when a bound is passed or the data is corrupt. Pure; no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import brotli  # type: ignore[import-untyped]  # mitmproxy depends on it; no stubs

try:  # the standard library from Python 3.14, the backport (a mitmproxy dependency) before
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the Python version
    from backports import zstd  # type: ignore[import-not-found,no-redef,unused-ignore]

STEP = 1 << 20  # bytes of output per decompressor call
READ_LIMIT = 16 << 20  # bytes one read may decode to
FLOOR = 64 << 20  # a body may always decode to this much
RATIO = 100  # beyond FLOOR, decoded bytes per compressed byte

ENCODINGS = ("identity", "gzip", "x-gzip", "deflate", "br", "zstd")


class Unscannable(Exception):
    """A body that cannot be decoded within the bounds, or that is corrupt."""


class _Step:
    """One coding's decompressor, driven in steps of at most STEP bytes of output."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._d: Any = None
        self._head = b""  # deflate: the first bytes, until zlib-or-raw can be told

    def _new(self, head: bytes) -> Any:
        if self.encoding == "br":
            return brotli.Decompressor()
        if self.encoding == "zstd":
            return zstd.ZstdDecompressor()
        if self.encoding == "deflate" and not (
            len(head) >= 2 and head[0] & 0x0F == 8 and int.from_bytes(head[:2]) % 31 == 0
        ):
            return zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate (RFC 1951), seen in the wild
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib or gzip header, detected

    def pieces(self, data: bytes) -> Any:
        """Yield the output for ``data`` in pieces of at most STEP bytes."""
        if self._d is None:
            if self.encoding == "deflate" and len(self._head + data) < 2 and data:
                self._head += data
                return
            data, self._head = self._head + data, b""
            self._d = self._new(data)
        d = self._d
        if self.encoding == "br":
            out = d.process(data, output_buffer_limit=STEP)
            yield out
            while not d.can_accept_more_data():
                out = d.process(b"", output_buffer_limit=STEP)
                if not out:
                    break
                yield out
            return
        while True:
            if self.encoding == "zstd":
                out = d.decompress(data, max_length=STEP)
                data = b""
                yield out
                if d.eof:
                    rest = d.unused_data
                    self._d = d = zstd.ZstdDecompressor()
                    if not rest:
                        return
                    data = rest
                elif d.needs_input:
                    return
            else:
                out = d.decompress(data, STEP)
                yield out
                data = d.unconsumed_tail
                if d.eof and d.unused_data.strip(b"\0"):  # another gzip member follows
                    data, self._d = d.unused_data, self._new(d.unused_data)
                    d = self._d
                elif not data and len(out) < STEP:
                    return


def decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    """A function that decodes one read of a body in ``encoding`` (a Content-Encoding value) and
    returns its output; call it with ``b""`` at the end of the body. None when there is no
    decoder for ``encoding``. The function raises :class:`Unscannable`."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return lambda b: b
    if encoding not in ENCODINGS:
        return None
    step = _Step("gzip" if encoding == "x-gzip" else encoding)
    seen = [0, 0]  # compressed in, decoded out

    def decode(data: bytes) -> bytes:
        seen[0] += len(data)
        out: list[bytes] = []
        size = 0
        try:
            for piece in step.pieces(data):
                size += len(piece)
                seen[1] += len(piece)
                if size > READ_LIMIT:
                    raise Unscannable(f"{encoding} body: one read decodes to more than {READ_LIMIT} bytes")
                if seen[1] > max(FLOOR, RATIO * seen[0]):
                    raise Unscannable(
                        f"{encoding} body decodes to more than {RATIO}x its size (past {FLOOR} bytes)"
                    )
                out.append(piece)
        except (zlib.error, brotli.error, zstd.ZstdError, EOFError) as e:
            raise Unscannable(f"{encoding} body is corrupt ({type(e).__name__})") from None
        return b"".join(out)

    return decode
