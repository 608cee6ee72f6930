"""S3 ``aws-chunked`` uploads signed chunk by chunk (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``):
verify each chunk's signature on the placeholder chain, re-sign it on the real chain, as the
body streams.

Source: AWS S3 "Signature calculations for the Authorization header: Transferring payload in
multiple chunks (chunked upload) (AWS Signature Version 4)". A chunk is
``hex(size);chunk-signature=SIG CRLF data CRLF``; the last has size 0. Each signature is over
``AWS4-HMAC-SHA256-PAYLOAD \\n date \\n scope \\n previous signature \\n sha256("") \\n
sha256(data)``, the first one chaining on the seed (the request's own signature).

A chunk is held until its data is whole (its new signature, which precedes the data, depends on
it), so memory is bounded by the largest chunk, ``MAX_CHUNK`` bytes (SDKs send 64 KiB to 1 MiB;
a larger one is refused). Anything after the last chunk, a size or a signature that is not the
placeholder chain's, a size that is not bare hex digits (``0x10``: Python reads it, a strict
upstream does not; the client's spelling is passed on) or a header line past ``_MAX_LINE``
raises :class:`proxy.core.sigv4.SigV4Error` (``sigv4_bad_chunk``) before a
byte of that chunk is passed on. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac

from proxy.core.sigv4 import EMPTY_SHA256, SigV4Error, sign

MAX_CHUNK = 8 * 1024 * 1024
_MAX_LINE = 200  # hex size + ";chunk-signature=" + 64 hex digits + CRLF, with room
_HEX = frozenset(b"0123456789abcdefABCDEF")


def chunk_string(amz_date: str, scope: str, previous: str, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    return "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, EMPTY_SHA256, digest])


def _bad(why: str) -> SigV4Error:
    return SigV4Error("sigv4_bad_chunk", f"aws-chunked body: {why}")


class ChunkResigner:
    """Feed the client's body bytes; get the re-signed bytes to send. ``finish`` at the end."""

    def __init__(
        self,
        amz_date: str,
        scope: str,
        placeholder_key: bytes,
        placeholder_seed: str,
        real_key: bytes,
        real_seed: str,
    ) -> None:
        self._date, self._scope = amz_date, scope
        self._pkey, self._pprev = placeholder_key, placeholder_seed
        self._rkey, self._rprev = real_key, real_seed
        self._carry = bytearray()
        self._want: tuple[int, str, bytes] | None = None  # (size, claimed signature) of the chunk being read
        self.done = False
        self.decoded = 0  # payload bytes seen

    def feed(self, data: bytes) -> bytes:
        self._carry += data
        out: list[bytes] = []
        while True:
            if self.done:
                if self._carry:
                    raise _bad("bytes after the final chunk")
                break
            if self._want is None:
                end = self._carry.find(b"\r\n")
                if end > _MAX_LINE or (end < 0 and len(self._carry) > _MAX_LINE):
                    raise _bad("a chunk header line is too long")
                if end < 0:
                    break
                self._want = self._header(bytes(self._carry[:end]))
                del self._carry[: end + 2]
            size, claimed, spelled = self._want
            if len(self._carry) < size + 2:
                break
            chunk = bytes(self._carry[:size])
            if self._carry[size : size + 2] != b"\r\n":
                raise _bad("a chunk's data does not end with CRLF")
            del self._carry[: size + 2]
            self._want = None
            out.append(self._resign(spelled, claimed, chunk))
            if size == 0:
                self.done = True
        return b"".join(out)

    def finish(self) -> None:
        if not self.done:
            raise _bad("the body ended before its final chunk")

    def _header(self, line: bytes) -> tuple[int, str, bytes]:
        size_s, sep, ext = line.partition(b";")
        if not sep or not ext.startswith(b"chunk-signature=") or not size_s:
            raise _bad("a chunk header is not size;chunk-signature=")
        if not set(size_s) <= _HEX:  # int(_, 16) also reads "0x10": the upstream may not
            raise _bad("a chunk size is not hexadecimal")
        try:
            size = int(size_s, 16)
        except ValueError:
            raise _bad("a chunk size is not hexadecimal") from None
        if size > MAX_CHUNK:
            raise _bad(f"a chunk is larger than {MAX_CHUNK} bytes")
        return size, ext[len(b"chunk-signature=") :].decode("latin-1"), size_s

    def _resign(self, spelled: bytes, claimed: str, data: bytes) -> bytes:
        expect = sign(self._pkey, chunk_string(self._date, self._scope, self._pprev, data))
        if not hmac.compare_digest(expect, claimed):
            raise _bad("a chunk signature is not the placeholder key's chain")
        self._pprev = expect
        self._rprev = sign(self._rkey, chunk_string(self._date, self._scope, self._rprev, data))
        self.decoded += len(data)
        # the client's own spelling of the size: the body's length does not change
        return b"%s;chunk-signature=%s\r\n%s\r\n" % (spelled, self._rprev.encode("ascii"), data)
