"""The tables of what a reflected secret may look like, for :mod:`proxy.core.scrub`: the plain
spellings of a secret (itself, its recodings, its base64 forms), the escapes a spelling may hold
and how they are decoded with a map back to the original offsets, and which media types are
binary (searched for the plain spellings only).

Which forms these tables catch, and which they do not, is listed in :mod:`proxy.core.scrub`.

Pure; no I/O.
"""

from __future__ import annotations

import contextlib
import re

from proxy.core import base64run


def recoded(secret: bytes) -> list[bytes]:
    """A non-ASCII (UTF-8) secret as a server that gets the charset wrong writes it: its UTF-8
    bytes read as Latin-1 and written as UTF-8 ("Ã©" for "é"), and Latin-1 itself when every
    character has a Latin-1 byte."""
    out = [secret.decode("latin-1").encode()]
    with contextlib.suppress(UnicodeDecodeError, UnicodeEncodeError):
        out.append(secret.decode().encode("latin-1"))
    return out


def secret_spellings(
    secret: bytes, placeholder: bytes
) -> tuple[dict[bytes, bytes], dict[bytes, base64run.Run]]:
    """The plain spellings of ``secret`` (itself, its recodings, its base64 forms), each with its
    replacement, and how to replace the base64 ones inside a run (proxy/core/base64run.py)."""
    out = {secret: placeholder}
    if any(b >= 0x80 for b in secret):  # a non-ASCII value, in the byte spellings servers produce
        for other in recoded(secret):
            out.setdefault(other, placeholder)
    runs = base64run.spellings(secret, placeholder)
    for text, run in runs.items():
        out.setdefault(text, run.alone or run.core)  # (the replacement is made by base64run.replace)
    return out, runs


# The escapes the forms use: %XX, \uXXXX (a surrogate pair as two), \/ \" \\, and + for a space.
ESCAPE = rb"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\[/\"\\]"
_BASE_TOKEN = (
    rb"%([0-9A-Fa-f]{2})|\\u([dD][89abAB][0-9A-Fa-f]{2})\\u([dD][c-fC-F][0-9A-Fa-f]{2})"
    rb"|\\u([0-9A-Fa-f]{4})|\\([/\"])"
)
# one tokenizer per view (see unescape): a token skipped after matching would hide the next one
TOKENS = {
    (spaces, backslash): re.compile(
        _BASE_TOKEN + (rb"|\\(\\)" if backslash else rb"|(?!)()") + (rb"|(\+)" if spaces else rb"|(?!)()")
    )
    for spaces in (False, True)
    for backslash in (False, True)
}
# a byte an escape starts with ("+" is one only when a spelling holds a space: looked at anyway)
ESCAPE_HEAD = re.compile(rb"[%\\+]")
# a tail that may be the start of an escape the next read completes
OPEN_ESCAPE = re.compile(
    rb"(?:%[0-9A-Fa-f]?|\\(?:u[0-9A-Fa-f]{0,3})?|\\u[dD][89abAB][0-9A-Fa-f]{2}\\?u?[0-9A-Fa-f]{0,3})\Z"
)
# the escape kinds a claim may seek (Compiled.kinds): the one-byte ones only when a spelling holds
# their byte; proxy.core.scrubheads.Heads finds where each kind starts
KINDS = (b"%hh", b"\\uhhhh", b"\\/", b'\\"', b"\\\\")


View = tuple[bool, bool, bool]  # decode "+" as a space; "\\\\" as a backslash; \u0080-\u00ff as bytes


def unescape(data: bytes, start: int, end: int, view: View) -> tuple[bytes, list[int]]:
    """``data[start:end]`` with every escape decoded, and for each decoded byte (and the end) the
    offset in ``data`` where the escape or byte it came from starts.

    ``view`` says whether "+" is read as a space (a form body), "\\\\" as a backslash, and
    ``\\u0080``..``\\u00ff`` as the one byte they number (the per-byte spelling of UTF-8 that a
    server treating bytes as Latin-1 writes: ``\\u00c3\\u00a9`` for "é"). The backslash view is
    off unless a secret holds a backslash: decoding starts anywhere in a run of backslashes, so
    pairing them could hide a ``\\u`` escape that another alignment reveals; the byte view is
    off unless a secret holds a non-ASCII byte.

    The escapes of one byte (``%XX``, ``\\u00XX``, the one-character ones) are looked up in a
    table made once (:data:`_PIECES`); a body made of nothing but escapes (``%41%41…``) decodes
    one dict lookup an escape, not five group tests and an int()."""
    out = bytearray()
    offsets: list[int] = []
    pos = start
    pieces = _PIECES[view[2]]
    for m in TOKENS[view[0], view[1]].finditer(data, start, end):
        at, to = m.span()
        if at > pos:
            out += data[pos:at]
            offsets += range(pos, at)
        piece = pieces.get(data[at:to])
        if piece is None:
            piece = _decode(m, view)
        out += piece
        if len(piece) == 1:
            offsets.append(at)
        else:
            offsets += [at] * len(piece)
        pos = to
    out += data[pos:end]
    offsets += range(pos, end)
    offsets.append(end)
    return bytes(out), offsets


def _decode(m: re.Match[bytes], view: View) -> bytes:
    """What the token ``m`` of :data:`TOKENS` decodes to under ``view``."""
    if m.group(1) is not None:
        return bytes([int(m.group(1), 16)])
    if m.group(2) is not None:
        hi, lo = int(m.group(2), 16), int(m.group(3), 16)
        return chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)).encode()
    if m.group(4) is not None:
        point = int(m.group(4), 16)
        if view[2] and 0x80 <= point <= 0xFF:
            return bytes([point])
        return chr(point).encode("utf-8", "surrogatepass")
    if m.group(5) is not None:
        return m.group(5)
    if m.group(6) is not None:
        return b"\\"
    return b" "


def _pieces(byte_view: bool) -> dict[bytes, bytes]:
    """Every escape of one byte value in every hex case, with what it decodes to (as
    :func:`_decode` does: each is checked against it in tests/unit/core/test_scrubforms.py)."""
    digits = "0123456789abcdefABCDEF"
    table: dict[bytes, bytes] = {b"\\/": b"/", b'\\"': b'"', b"\\\\": b"\\", b"+": b" "}
    for hi in digits:
        for lo in digits:
            value = int(hi + lo, 16)
            table[f"%{hi}{lo}".encode()] = bytes([value])
            code = f"\\u00{hi}{lo}".encode()
            table[code] = bytes([value]) if byte_view and value >= 0x80 else chr(value).encode()
    return table


# by the byte view (View[2]): the one-byte escapes and what they decode to
_PIECES = {False: _pieces(False), True: _pieces(True)}


# Media types whose bodies are binary: escaped spellings are not sought in them (escapes_matter).
_BINARY_TOP_LEVEL = ("image/", "audio/", "video/", "font/")
_BINARY_TYPES = frozenset(
    {
        "application/octet-stream",
        "application/zip",
        "application/gzip",
        "application/x-gzip",
        "application/x-tar",
        "application/x-xz",
        "application/x-bzip2",
        "application/zstd",
        "application/x-7z-compressed",
        "application/java-archive",
        "application/pdf",
        "application/wasm",
        "application/x-git-upload-pack-result",
        "application/x-git-receive-pack-result",
        "application/vnd.git-lfs",
        "application/grpc",
        "application/protobuf",
        "application/x-protobuf",
        "application/cbor",
        "application/msgpack",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)
_TEXT_EXCEPTIONS = ("+xml", "+json")  # image/svg+xml is text


def escapes_matter(content_type: str) -> bool:
    """Whether a response body of this ``Content-Type`` value is searched for escaped spellings
    (percent, JSON ``\\u``/``\\/``/``\\"``/``\\\\``, ``+``), or only for the plain ones (the
    secret and its base64 forms), through :attr:`proxy.core.scrubmatch.Compiled.binary`.

    Escapes belong to text: URLs, forms, JSON, HTML. An archive, an image, a git pack or a
    protobuf message that holds a secret by accident holds its bytes, found as plain spellings;
    finding escapes in them costs ~6 times the plain search (random bytes hold a ``%`` or a
    ``\\`` every 128 bytes). Binary: ``image/``, ``audio/``, ``video/``, ``font/`` (but not
    ``+xml``/``+json`` types such as ``image/svg+xml``), and the archive, package, git, gRPC and
    serialization types listed in ``_BINARY_TYPES``. Everything else, a missing or unparsable
    type included, is text. Parameters (``; charset=...``) are ignored; case is not significant.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media.endswith(_TEXT_EXCEPTIONS):
        return True
    return not (media in _BINARY_TYPES or media.startswith(_BINARY_TOP_LEVEL))
