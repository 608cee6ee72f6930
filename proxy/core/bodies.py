"""Request bodies: placeholders swapped on the fly, whatever the chunking, in flat memory.

Pure: bytes in, bytes out. :class:`Swapper` is fed the reads of a body (mitmproxy hands a
callable ``stream`` reads of up to 64 KiB) and returns what may be forwarded now. A placeholder
may straddle two reads, so only a tail that could still become one is held back: at most
``HOLD`` bytes, the longest placeholder (``surr_`` or a template's).
The output is the same whatever the chunking: the
matches are exactly those :func:`proxy.core.placeholders.find` gives over the whole body.

What a placeholder becomes is asked of a ``resolve`` callable (``proxy.core.substitute.BodyResolver``):
replacement bytes, ``None`` to leave it, or an exception to stop. It is asked before any byte of
the read holding the placeholder is returned, so a refused placeholder never leaves.

Only placeholders spelled out raw are found: JSON and form encoders never escape letters, digits
or ``_``, and a placeholder hidden in an escaped spelling cannot turn into a secret (it is not
swapped), so it is no leak.

The secret is escaped as the body's media type needs (:func:`escape`): JSON string escaping for
``application/json`` and ``+json`` (RFC 8259 §7), percent-encoding for
``application/x-www-form-urlencoded`` (every byte but the RFC 3986 §2.3 unreserved ones, so ``&``,
``=`` and ``+`` cannot split the field), raw otherwise.

Compressed bodies (``Content-Encoding`` gzip, x-gzip, deflate, br, zstd; RFC 9110 §8.4.1) are
decoded read by read (:func:`decoder`) with a bound on the decoded size (:class:`TooLarge` past
it) and re-encoded (:func:`encoder`), so the upstream gets the encoding it was sent. Every gzip
member and zstd frame is decoded (RFC 1952 §2.2, RFC 8878 §3.1), as the upstream's decoder reads
them all; bytes after the end of a deflate (zlib) stream or a brotli stream are
:class:`BadEncoding`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import brotli  # type: ignore[import-untyped]  # mitmproxy depends on it; no stubs

try:  # Python 3.14's compression.zstd (PEP 784), or its backport, which mitmproxy depends on
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - Python < 3.14
    from backports import zstd  # type: ignore[no-redef,unused-ignore]

from proxy.core import placeholders

Resolve = Callable[[bytes], bytes | None]

HOLD = placeholders.LONGEST
# What may still grow into a placeholder at the end of what was read: a proper beginning of any
# placeholder prefix ("surr_", "ghp_", ...), or a prefix and up to its placeholders' letters or
# digits (the whole run must end to know it is one).
_PARTIAL = re.compile(
    b"(?:"
    + b"|".join(
        sorted(
            {re.escape(p[:i]) for p in placeholders.MAX_BODY for i in range(1, len(p))}
            | {re.escape(p) + b"[A-Za-z0-9]{0,%d}" % n for p, n in placeholders.MAX_BODY.items()}
        )
    )
    + rb")\Z"
)
_UNRESERVED = "-._~"  # RFC 3986 §2.3, with ALPHA / DIGIT which quote() never escapes

MAX_DECODED = 256 * 1024 * 1024  # default bound on a decoded (decompressed) request body, bytes
_PIECE = 256 * 1024  # zlib output per step while decoding, bytes: bounds memory per read


class TooLarge(Exception):
    """A compressed body decodes to more than the bound (a decompression bomb, or just too big)."""


class BadEncoding(Exception):
    """A compressed body that does not decode in the encoding it claims."""


class Swapper:
    """Feed reads with :meth:`feed`, then call :meth:`finish` once; join what they return."""

    def __init__(self, resolve: Resolve) -> None:
        self.resolve = resolve
        self.held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of ``held + chunk`` may be forwarded now, placeholders resolved."""
        if not chunk:
            return b""
        return self._run(self.held + chunk if self.held else chunk, final=False)

    def finish(self) -> bytes:
        """The held-back tail, resolved: the body has ended."""
        return self._run(self.held, final=True)

    def _run(self, buf: bytes, final: bool) -> bytes:
        out: list[bytes] = []
        pos = 0  # what is before pos has been written to out
        scanned = 0  # where a full-body scan would resume: the end of the last match
        cut = len(buf)  # what is from cut on is held back
        for m in placeholders.find(buf):
            if not final and m.end() == len(buf):  # the run may go on in the next read
                cut = m.start()
                break
            scanned = m.end()
            replacement = self.resolve(m.group())
            if replacement is not None:
                out.append(buf[pos : m.start()])
                out.append(replacement)
                pos = m.end()
        else:
            if not final:
                partial = _PARTIAL.search(buf, max(scanned, len(buf) - HOLD))
                if partial is not None:
                    cut = partial.start()
        self.held = buf[cut:]
        if not out and cut == len(buf):  # the common case: nothing swapped, nothing held
            return buf
        out.append(buf[pos:cut])
        return b"".join(out)


# Methods whose requests carry no body in practice (RFC 9110 §9.3): an HTTP/2 request of these
# without Content-Length is taken to have none, so it is not given chunked framing.
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})


def may_have_body(http_version: str, method: str, content_length: str | None, chunked: bool) -> bool:
    """Whether a request may carry a body, from its head: HTTP/1 by Content-Length or
    Transfer-Encoding (``chunked``: the header is present; RFC 9112 §6.3); HTTP/2 and 3 by
    Content-Length, else by method (their head does not say, and mitmproxy does not show the
    hook whether the HEADERS frame ended the stream)."""
    if content_length is not None:
        return not (content_length.strip().isdigit() and int(content_length) == 0)
    if http_version.startswith("HTTP/1"):
        return chunked
    return method.upper() not in _BODILESS


def kind(content_type: str) -> str:
    """``json``, ``form`` or ``raw`` for a Content-Type value (parameters ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return "json"
    if media == "application/x-www-form-urlencoded":
        return "form"
    return "raw"


def escape(secret: str, how: str) -> bytes:
    """``secret`` as it must be written in a body of kind ``how`` (see :func:`kind`), or in a
    URL query (``query``, RFC 3986 §3.4: percent-encoded like a form value)."""
    if how == "json":
        return json.dumps(secret)[1:-1].encode("ascii")
    if how in ("form", "query"):
        return quote(secret, safe=_UNRESERVED).encode("ascii")
    return secret.encode()


ENCODINGS = ("gzip", "x-gzip", "deflate", "br", "zstd")


Decoder = Callable[[bytes], Iterator[bytes]]


def decoder(encoding: str, limit: int = MAX_DECODED) -> Decoder | None:
    """A read-by-read decoder for a Content-Encoding token (``""``/``identity``: pass-through),
    or None for one it does not know. Each call yields the decoded read in pieces of about
    256 KiB (brotli's bound is soft: up to about twice that), as a 64 KiB gzip read can inflate
    to 64 MiB and is never held whole; call it with
    ``b""`` at the end of the body. Raises TooLarge past ``limit`` decoded bytes, BadEncoding
    on corrupt input."""
    total = [0]

    def count(data: bytes) -> bytes:
        total[0] += len(data)
        if total[0] > limit:
            raise TooLarge(f"decoded body exceeds {limit} bytes")
        return data

    if encoding in ("", "identity"):

        def identity(b: bytes) -> Iterator[bytes]:
            if b:
                yield b

        return identity
    if encoding in ("gzip", "x-gzip", "deflate"):
        # 32 + MAX_WBITS: a zlib or gzip header, detected (servers read "deflate" as zlib, RFC 9110 §8.4.1.2)
        z: list[Any] = [zlib.decompressobj(32 + zlib.MAX_WBITS)]
        members = encoding != "deflate"

        def inflate(b: bytes) -> Iterator[bytes]:
            try:
                if not b:
                    yield count(z[0].flush())
                    return
                data = b
                while data:
                    if z[0].eof:
                        # gzip is a series of members (RFC 1952 §2.2), and the decoders upstream
                        # (Python's, Go's, Node's) read them all: so are they read here, or a
                        # placeholder could ride in the second; a zlib stream (RFC 1950) is one
                        if not members:
                            raise BadEncoding("bytes after the end of the deflate stream")
                        data = data.lstrip(b"\0")  # zero padding between members, as Python's
                        if not data:  # gzip reads it (and proxy/core/decode.py for responses)
                            break
                        z[0] = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    yield count(z[0].decompress(data, _PIECE))
                    data = z[0].unconsumed_tail or (z[0].unused_data if z[0].eof else b"")
            except zlib.error as e:
                raise BadEncoding(str(e)) from None

        return inflate
    if encoding == "br":
        d: Any = brotli.Decompressor()

        def unbrotli(b: bytes) -> Iterator[bytes]:
            try:
                if not b:
                    return
                piece = count(d.process(b, output_buffer_limit=_PIECE))
                yield piece
                while piece and not d.is_finished():
                    piece = count(d.process(b"", output_buffer_limit=_PIECE))
                    yield piece
            except brotli.error as e:
                raise BadEncoding(str(e)) from None

        return unbrotli
    if encoding == "zstd":
        zd: list[Any] = [zstd.ZstdDecompressor()]

        def unzstd(b: bytes) -> Iterator[bytes]:
            data = b
            try:
                while data or not zd[0].needs_input:
                    if zd[0].eof:  # a body may hold several frames (RFC 8878 §3.1)
                        data, zd[0] = zd[0].unused_data + data, zstd.ZstdDecompressor()
                        if not data:
                            break
                    yield count(zd[0].decompress(data, _PIECE))
                    data = b""
            except zstd.ZstdError as e:
                raise BadEncoding(str(e)) from None

        return unzstd
    return None


def encoder(encoding: str) -> Callable[[bytes], bytes]:
    """A read-by-read encoder for a Content-Encoding token :func:`decoder` knows; ``b""`` ends
    the stream. Each read is flushed (a sync flush), so nothing waits in the compressor."""
    if encoding in ("", "identity"):
        return lambda b: b
    if encoding in ("gzip", "x-gzip", "deflate"):
        wbits = 16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS
        z: Any = zlib.compressobj(6, zlib.DEFLATED, wbits)
        return lambda b: z.compress(b) + z.flush(zlib.Z_SYNC_FLUSH) if b else z.flush()
    if encoding == "br":
        c: Any = brotli.Compressor()
        return lambda b: c.process(b) + c.flush() if b else c.finish()
    if encoding == "zstd":
        zc: Any = zstd.ZstdCompressor()
        return lambda b: zc.compress(b, zc.FLUSH_BLOCK) if b else zc.flush()
    raise ValueError(f"unknown content-encoding {encoding!r}")
