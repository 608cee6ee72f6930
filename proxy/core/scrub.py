"""Scrubbing: secret → placeholder in what comes back, so an upstream that reflects a secret
(an echo endpoint, an error page, a token-info call) cannot hand it to the sandbox.

:class:`Scrubber` works on a stream of chunks. It replaces every complete occurrence of a
secret, in any of the forms below, and holds back only the longest tail of a chunk that could
still be the start of one, so a secret split across two reads is still caught while an SSE event
that cannot be a secret's start goes out in the same read (a read that ends in a base64
character also holds that byte and the 5 before it: it may be the boundary character of a run
the next read completes, re-encoded with it, :mod:`proxy.core.base64run`). The carry is bounded by
the longest form (at most 6 bytes per secret byte, for ``\\u`` escapes) minus one byte, plus
those 6. The output is the same whatever the chunking: a property the tests check.

Forms caught, for a secret S and its placeholder P:

- **S itself, and S with any of its characters escaped**, in any mix: percent-encoding of the
  character's UTF-8 bytes with upper- or lower-case hex (RFC 3986 §2.1), ``+`` for a space
  (application/x-www-form-urlencoded), JSON ``\\uXXXX`` of any character, upper- or lower-case
  hex, with a surrogate pair beyond the BMP (RFC 8259 §7), and JSON's ``\\/``, ``\\"``, ``\\\\``.
  Replaced by P as it is: a placeholder is ``surr_`` and ASCII letters and digits, which need no
  escaping in a URL, a form or a JSON string.
- **Base64 of S**, standard and URL-safe alphabets (RFC 4648 §4, §5), its characters possibly
  percent- or JSON-escaped as above (``%2B``, ``\\/``): the whole encoding of S alone, padded or
  not, becomes P's encoding (so a client that decodes it reads P); S inside a longer run
  (``Basic`` credentials ``user:S``, a JWT, a JSON blob), at any of its three bit alignments, is
  decoded, replaced and re-encoded in place, so the run stays valid base64 and keeps no bit of
  S (:mod:`proxy.core.base64run` says how).
  Only spellings of at least 8 characters are matched (secrets of 7 bytes or more at every
  alignment, of 6 at one): shorter ones would hit unrelated base64 text.
- **A non-ASCII S** (UTF-8) also per byte as JSON ``\\u0080``..``\\u00ff`` (a server treating
  bytes as Latin-1, ``\\u00c3\\u00a9`` for "é"), as its UTF-8 read as Latin-1 and written as
  UTF-8 ("Ã©"), and in Latin-1 when it has one. (Per byte or per character, not both in one
  spelling: no server mixes them.)

Not caught (documented limits): double encoding (``%2541``), HTML character references
(``&#x41;``), base64 with line breaks inside S's slice (MIME, PEM), base64 of an escaped S,
other encodings (hex, base32, compression inside the body, a body in UTF-16 or UTF-32,
JavaScript's or C's ``\\xNN``, quoted-printable with a soft line break inside S), S with its case
changed (upper- or lower-cased), and S split by anything the forms above do not produce.

How: every form above is one plain spelling (S, or a base64 slice of S) with some characters
escaped, so a claim's secrets compile to one alternation of plain spellings, longest first
(Python's ``re`` scans it at ~150 MB/s and compiles 10,000 secrets in well under a second).
Escaped spellings are found by decoding: within reach of an escape sequence the data is decoded
(``%XX`` to its byte, ``\\uXXXX`` and surrogate pairs to UTF-8, ``\\/ \\" \\\\``, and ``+`` to a
space when a secret holds one) with a map back to the original offsets, and the same
alternation runs on the decoded bytes; a match there replaces the escaped original. Whether a
held tail could still grow into a match is one binary search in the sorted spellings. An
earlier version built an escape-aware pattern per form: 45 s to compile for 1,000 secrets, on
the event loop.

Pure; no I/O.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ahocorasick  # type: ignore[import-not-found]  # no stubs

from proxy.core import base64run

_NEVER = 1 << 62  # a search start past any data: "not searched yet"
_FIND_LIMIT = 32  # strings: up to this, one bytes.find per string (see _Literals)
_RE_LIMIT = 512  # strings: past this, an automaton (see _Literals)
MIN_BASE64 = base64run.MIN_BASE64
_EXPANSION = 12  # original bytes per decoded byte at most (a surrogate pair: 12 for 4 bytes)


def _recoded(secret: bytes) -> list[bytes]:
    """A non-ASCII (UTF-8) secret as a server that gets the charset wrong writes it: its UTF-8
    bytes read as Latin-1 and written as UTF-8 ("Ã©" for "é"), and Latin-1 itself when every
    character has a Latin-1 byte."""
    out = [secret.decode("latin-1").encode()]
    with contextlib.suppress(UnicodeDecodeError, UnicodeEncodeError):
        out.append(secret.decode().encode("latin-1"))
    return out


def _spellings(secret: bytes, placeholder: bytes) -> tuple[dict[bytes, bytes], dict[bytes, base64run.Run]]:
    """The plain spellings of ``secret`` (itself, its recodings, its base64 forms), each with its
    replacement, and how to replace the base64 ones inside a run (proxy/core/base64run.py)."""
    out = {secret: placeholder}
    if any(b >= 0x80 for b in secret):  # a non-ASCII value, in the byte spellings servers produce
        for other in _recoded(secret):
            out.setdefault(other, placeholder)
    runs = base64run.spellings(secret, placeholder)
    for text, run in runs.items():
        out.setdefault(text, run.alone or run.core)  # (the replacement is made by base64run.replace)
    return out, runs


# The escapes the forms use: %XX, \uXXXX (a surrogate pair as two), \/ \" \\, and + for a space.
_ESCAPE = rb"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\[/\"\\]"
_BASE_TOKEN = (
    rb"%([0-9A-Fa-f]{2})|\\u([dD][89abAB][0-9A-Fa-f]{2})\\u([dD][c-fC-F][0-9A-Fa-f]{2})"
    rb"|\\u([0-9A-Fa-f]{4})|\\([/\"])"
)
# one tokenizer per view (see _decode): a token skipped after matching would hide the next one
_TOKENS = {
    (spaces, backslash): re.compile(
        _BASE_TOKEN + (rb"|\\(\\)" if backslash else rb"|(?!)()") + (rb"|(\+)" if spaces else rb"|(?!)()")
    )
    for spaces in (False, True)
    for backslash in (False, True)
}
# a byte an escape starts with ("+" is one only when a spelling holds a space: looked at anyway)
_ESCAPE_HEAD = re.compile(rb"[%\\+]")
# a tail that may be the start of an escape the next read completes
_OPEN_ESCAPE = re.compile(
    rb"(?:%[0-9A-Fa-f]?|\\(?:u[0-9A-Fa-f]{0,3})?|\\u[dD][89abAB][0-9A-Fa-f]{2}\\?u?[0-9A-Fa-f]{0,3})\Z"
)
# _ESCAPE's escapes as fixed strings over a skeleton of the data: hex digits read "h", the bytes an
# escape is made of stay, everything else is NUL.
_SKELETON = bytes(
    ord("h") if chr(b) in "0123456789abcdefABCDEF" else b if chr(b) in '%\\u/"+' else 0 for b in range(256)
)
_KINDS = (b"%hh", b"\\uhhhh", b"\\/", b'\\"', b"\\\\")


View = tuple[bool, bool, bool]  # decode "+" as a space; "\\\\" as a backslash; \u0080-\u00ff as bytes


def _decode(data: bytes, start: int, end: int, view: View) -> tuple[bytes, list[int]]:
    """``data[start:end]`` with every escape decoded, and for each decoded byte (and the end) the
    offset in ``data`` where the escape or byte it came from starts.

    ``view`` says whether "+" is read as a space (a form body), "\\\\" as a backslash, and
    ``\\u0080``..``\\u00ff`` as the one byte they number (the per-byte spelling of UTF-8 that a
    server treating bytes as Latin-1 writes: ``\\u00c3\\u00a9`` for "é"). The backslash view is
    off unless a secret holds a backslash: decoding starts anywhere in a run of backslashes, so
    pairing them could hide a ``\\u`` escape that another alignment reveals; the byte view is
    off unless a secret holds a non-ASCII byte."""
    out = bytearray()
    offsets: list[int] = []
    pos = start
    for m in _TOKENS[view[0], view[1]].finditer(data, start, end):
        out += data[pos : m.start()]
        offsets += range(pos, m.start())
        if m.group(1) is not None:
            piece = bytes([int(m.group(1), 16)])
        elif m.group(2) is not None:
            hi, lo = int(m.group(2), 16), int(m.group(3), 16)
            piece = chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)).encode()
        elif m.group(4) is not None:
            point = int(m.group(4), 16)
            if view[2] and 0x80 <= point <= 0xFF:
                piece = bytes([point])
            else:
                piece = chr(point).encode("utf-8", "surrogatepass")
        elif m.group(5) is not None:
            piece = m.group(5)
        elif m.group(6) is not None:
            piece = b"\\"
        else:
            piece = b" "
        out += piece
        offsets += [m.start()] * len(piece)
        pos = m.end()
    out += data[pos:end]
    offsets += range(pos, end)
    offsets.append(end)
    return bytes(out), offsets


class _Literals:
    """Leftmost-longest search for many byte strings at once.

    Up to :data:`_FIND_LIMIT` strings (a claim with a few credentials), ``search`` runs one
    ``bytes.find`` per string (several GB/s each: it skips ahead by the string's length, where
    ``re`` steps through every byte at ~200 MB/s), remembering each string's next occurrence in
    the data being scanned. Up to :data:`_RE_LIMIT` strings: one ``re`` alternation, longest
    first. Beyond: an Aho-Corasick automaton (pyahocorasick; bytes mapped 1:1
    to code points through latin-1), whose cost does not grow with the number of strings (~17
    MB/s in a measured run): the alternation of 10,000 secrets' spellings scanned 7.6 KB in 1.9 s,
    as base64 spellings can start almost anywhere.
    """

    def __init__(self, spellings: Iterable[bytes]) -> None:
        words = sorted(spellings, key=len, reverse=True)
        self._words = tuple(words) if len(words) <= _FIND_LIMIT else ()
        self._found: tuple[bytes, list[tuple[int, int]]] | None = None  # see _find
        self._rx: re.Pattern[bytes] | None = None
        self._automaton: Any = None
        if len(words) <= _RE_LIMIT:
            self._rx = re.compile(b"|".join(re.escape(w) for w in words))
        else:
            self._automaton = ahocorasick.Automaton()
            for w in words:
                self._automaton.add_word(w.decode("latin-1"), len(w))
            self._automaton.make_automaton()
        self._text: tuple[bytes, str] | None = None

    def _str(self, data: bytes) -> str:
        if self._text is None or self._text[0] is not data:
            self._text = (data, data.decode("latin-1"))
        return self._text[1]

    def search(self, data: bytes, pos: int = 0) -> tuple[int, int] | None:
        """(start, end) of the leftmost-longest string in ``data[pos:]``, or None."""
        if pos >= len(data):  # (pyahocorasick raises IndexError for a start at the end)
            return None
        if self._words:
            return self._find(data, pos)
        if self._rx is not None:
            m = self._rx.search(data, pos)
            return (m.start(), m.end()) if m else None
        for last, length in self._automaton.iter_long(self._str(data), pos):
            return last + 1 - length, last + 1
        return None

    def _find(self, data: bytes, pos: int) -> tuple[int, int] | None:
        # Each word's next occurrence, kept while the same data is searched at growing
        # positions, so a body full of matches costs one pass per word, not one per match.
        # (Bytes are immutable: the same object is the same data.) A word's entry is (where its
        # search started, what it found); it answers a search from ``pos`` when it started at or
        # before ``pos`` and found nothing, or found an occurrence at or after ``pos``.
        if self._found is None or self._found[0] is not data:
            self._found = (data, [(_NEVER, -1)] * len(self._words))
        known = self._found[1]
        best: tuple[int, int] | None = None
        for i, w in enumerate(self._words):  # longest first: the first at a start is the longest
            since, j = known[i]
            if since > pos or 0 <= j < pos:
                j = data.find(w, pos)
                known[i] = (pos, j)
            if j >= 0 and (best is None or j < best[0]):
                best = (j, j + len(w))
        return best

    def finditer(self, data: bytes) -> Iterator[tuple[int, int]]:
        """(start, end) of each leftmost-longest string in ``data``, left to right."""
        if self._rx is not None:
            for m in self._rx.finditer(data):
                yield m.start(), m.end()
            return
        for last, length in self._automaton.iter_long(data.decode("latin-1")):
            yield last + 1 - length, last + 1


@dataclass(frozen=True, slots=True)
class Compiled:
    spellings: dict[bytes, bytes]
    runs: dict[bytes, base64run.Run]  # the base64 spellings among them (proxy/core/base64run.py)
    ordered: list[bytes]  # sorted, for prefix tests by binary search
    literal: _Literals | None
    escape: re.Pattern[bytes]
    kinds: tuple[bytes, ...]
    views: tuple[View, ...]  # the decodings tried (see _decode)
    first: re.Pattern[bytes]  # any byte a spelling starts with
    longest: int  # bytes of the longest spelling, escaped
    # the bytes the spellings are made of: an escape that decodes to another byte cannot lie
    # inside a match, so no window is decoded around it (JSON's \" and \\, most %XX)
    made_of: frozenset[int] = frozenset()
    non_ascii: bool = False  # some spelling holds a byte >= 0x80 (a \uXXXX beyond ASCII may matter)
    binary: Compiled | None = None  # the same spellings, escaped forms not sought (escapes_matter)
    folded: Compiled | None = None  # the raw secrets lower-cased, for header names (Scrubber.scrub_name)


def _byte_class(values: Iterable[int]) -> re.Pattern[bytes]:
    """A pattern matching any one of the byte ``values`` (none: never)."""
    members = b"".join(re.escape(bytes([b])) for b in sorted(values))
    return re.compile(b"[" + members + b"]" if members else b"(?!)")


@functools.lru_cache(maxsize=64)
def _compile(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool) -> Compiled:
    """The patterns for ``pairs``, built once per set of pairs."""
    spellings: dict[bytes, bytes] = {}
    runs: dict[bytes, base64run.Run] = {}
    for secret, placeholder in pairs:
        if secret:
            forms, secret_runs = _spellings(secret, placeholder) if escapes else ({secret: placeholder}, {})
            for s, r in forms.items():
                if s not in spellings:
                    spellings[s] = r
                    if s in secret_runs:
                        runs[s] = secret_runs[s]
    joined = b"".join(spellings)
    made_of = frozenset(joined)
    spaces = escapes and b" " in joined
    backslash = escapes and b"\\" in joined
    non_ascii = escapes and not joined.isascii()
    views: list[View] = (
        [(False, False, False)]
        + [(True, False, False)] * spaces
        + [(False, True, False)] * backslash
        + [(False, backslash, True)] * non_ascii  # per-byte JSON escapes a backslash as JSON does
    )
    base = Compiled(
        spellings=spellings,
        runs=runs,
        ordered=sorted(spellings),
        # leftmost-longest: a secret that contains another is replaced whole
        literal=_Literals(spellings) if spellings else None,
        escape=re.compile(_ESCAPE + (rb"|\+" if spaces else b"")),
        # a one-byte escape of a byte no spelling holds is never sought (see Scrubber._may_matter)
        kinds=tuple(k for k in _KINDS if len(k) != 2 or k[1] in made_of) + ((b"+",) if spaces else ())
        if escapes
        else (),
        views=tuple(views),
        first=_byte_class({s[0] for s in spellings}),
        longest=max(map(len, spellings), default=0) * (_EXPANSION if escapes else 1),
        made_of=made_of,
        non_ascii=not joined.isascii(),
    )
    if not escapes:
        return base
    # (+1: a complete spelling that ends a read is held, so the byte after it, a base64 boundary
    # character maybe, is seen with it whatever the cut)
    plain = dataclasses.replace(
        base, kinds=(), views=((False, False, False),), longest=max(map(len, spellings), default=0) + 1
    )
    folded = _compile(tuple((s.lower(), p.lower()) for s, p in pairs if s), False)
    return dataclasses.replace(base, binary=plain, folded=folded)


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
    secret and its base64 forms), through :attr:`Compiled.binary`.

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


def compile_pairs(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool = True) -> Compiled:
    """The compiled patterns of ``pairs`` (cached), to hand to :class:`Scrubber` again."""
    return _compile(pairs, escapes)


class Scrubber:
    """``pairs``: (secret, placeholder) byte strings; empty secrets are ignored.

    ``escapes=False`` matches the raw secrets only.
    """

    def __init__(
        self, pairs: Iterable[tuple[bytes, bytes]], escapes: bool = True, compiled: Compiled | None = None
    ) -> None:
        """``compiled``: what :func:`compile_pairs` returned for these pairs, kept by the caller
        (hashing 10,000 pairs to find them in the cache cost ~100 µs per response)."""
        self._c = compiled if compiled is not None else _compile(tuple(pairs), escapes)
        self._skeleton: tuple[bytes, bytes] | None = None  # (data, its skeleton), see _escapes
        self._carry = b""

    @property
    def active(self) -> bool:
        return self._c.literal is not None

    @property
    def longest(self) -> int:
        """Bytes of the longest spelling of any form: the carry stays below this (plus the 6
        bytes held around a base64 boundary character, see :meth:`feed`)."""
        return self._c.longest

    def _next(self, data: bytes, pos: int) -> tuple[int, int, bytes] | None:
        """The leftmost match from ``pos``: (start, end, the spelling it is), or None.

        A spelling with an escape in it holds an escape, so it can only start within
        ``longest`` bytes before one; elsewhere only the plain spellings can match, and the
        alternation finds those in the data as it is.
        """
        c = self._c
        assert c.literal is not None
        lit = c.literal.search(data, pos)
        limit = lit[0] if lit else len(data)
        n = c.longest
        escapes = self._escapes(data, pos)
        t = next(escapes, None)
        while t is not None:
            start, last = max(pos, t - n + 1), t
            if start > limit:
                break
            # one decoded window over a run of escapes whose reach touches
            while (t := next(escapes, None)) is not None and t < last + n:
                last = t
            end = min(len(data), last + n)
            found: tuple[int, int, bytes] | None = None
            # "+" is a space in a form body and itself elsewhere: each reading is tried, and the
            # leftmost, then longest, match of any reading wins (a shorter reading of the same
            # text would leave a stray escape behind)
            for view in c.views:
                decoded, offsets = _decode(data, start, end, view)
                for ms, me in c.literal.finditer(decoded):
                    s, e = offsets[ms], offsets[me]
                    if s > last or s >= limit or (found is not None and (s, -e) >= (found[0], -found[1])):
                        break
                    if e > s and data[s:e] != decoded[ms:me]:  # an escaped spelling (else: plain)
                        found = (s, e, decoded[ms:me])
                        break
            if found is not None:
                return found
            pos = last + 1
        return (lit[0], lit[1], data[lit[0] : lit[1]]) if lit else None

    def _escapes(self, data: bytes, pos: int) -> Iterator[int]:
        """Where escapes start in ``data`` from ``pos``, in order.

        Few ``%``/``\\`` bytes (text): find each with memchr and check it. Many (binary data):
        map ``data`` to a skeleton (hex digits to ``h``, the escape bytes kept, all else NUL) in
        which each kind of escape is one fixed string bytes.find locates, so only real escapes
        cost a Python step.
        """
        kinds_all = self._c.kinds
        if not kinds_all:
            return
        heads: tuple[bytes, ...] = (b"%", b"\\", b"+") if b"+" in kinds_all else (b"%", b"\\")
        if sum(data.count(h, pos) for h in heads) <= 64:
            text, kinds, check = data, heads, True
        else:
            if self._skeleton is None or self._skeleton[0] is not data:
                self._skeleton = (data, data.translate(_SKELETON))
            text, kinds, check = self._skeleton[1], kinds_all, False
        nxt = {k: text.find(k, pos) for k in kinds}
        while live := [i for i in nxt.values() if i >= 0]:
            i = min(live)
            if (not check or self._c.escape.match(data, i)) and self._may_matter(data, i):
                yield i
            for k, at in nxt.items():
                if at == i:
                    nxt[k] = text.find(k, i + 1)

    def _may_matter(self, data: bytes, i: int) -> bool:
        """Whether the escape at ``i`` decodes to a byte some spelling holds. Every escape
        inside an escaped match decodes to a byte of that match, so the windows decoded around
        the escapes that pass still find every match (see _next)."""
        c = self._c
        head = data[i]
        if head == 0x25:  # %XX
            return int(data[i + 1 : i + 3], 16) in c.made_of
        if head == 0x5C:  # \uXXXX, \/, \", \\
            second = data[i + 1]
            if second == 0x75:
                point = int(data[i + 2 : i + 6], 16)
                return point in c.made_of if point < 0x80 else c.non_ascii
            return second in c.made_of
        return True  # "+": a space, and some spelling holds one (else "+" is no escape here)

    def _scan(self, data: bytes, cut: int) -> tuple[bytes, int]:
        """Replace the matches starting before ``cut``; returns the output and where it stops."""
        out: list[bytes] = []
        pos = 0
        while pos < cut and (m := self._next(data, pos)) is not None and m[0] < cut:
            start, end, spelling = m
            run = self._c.runs.get(spelling)
            if run is None:
                out += (data[pos:start], self._c.spellings[spelling])
            else:  # base64: the text around it stays valid base64 (proxy/core/base64run.py)
                head, replacement, end = base64run.replace(run, data, pos, start, end, spelling)
                out += (data[pos:head], replacement)
            # A complete match that runs into the held tail cannot grow (else the tail would
            # start at the match): send it replaced, hold back only what follows it.
            pos, cut = end, max(cut, end)
        out.append(data[pos:cut])
        return b"".join(out), cut

    def _could_start(self, text: bytes) -> bool:
        """True when ``text`` is a prefix of some spelling (binary search in the sorted ones)."""
        ordered = self._c.ordered
        i = bisect.bisect_left(ordered, text)
        return i < len(ordered) and ordered[i].startswith(text)

    def _held(self, data: bytes) -> int:
        """Length of the longest tail of ``data`` that could still grow into a match: the
        leftmost position, raw or decoded, where a spelling's first byte starts a prefix of it,
        or an escape the next read may complete."""
        c = self._c
        tail = len(data) - min(c.longest - 1, len(data))
        if tail >= len(data):
            return 0
        starts: list[int] = []
        for m in c.first.finditer(data, tail):
            if self._could_start(data[m.start() :]):
                starts.append(m.start())
                break
        if c.kinds:
            open_escape = _OPEN_ESCAPE.search(data, tail)
            end = open_escape.start() if open_escape else len(data)
            if open_escape:
                starts.append(end)
            # with no escape in the tail, open or whole, its decoding is the tail itself, searched
            # above (an open escape cuts the decoded window short: then it differs)
            for view in c.views if open_escape or _ESCAPE_HEAD.search(data, tail, end) else ():
                decoded, offsets = _decode(data, tail, end, view)
                for m in c.first.finditer(decoded):
                    if self._could_start(decoded[m.start() :]):
                        starts.append(offsets[m.start()])
                        break
        return len(data) - min(starts) if starts else 0

    def feed(self, chunk: bytes) -> bytes:
        """Scrub ``chunk`` (with what was held back); returns what may be sent now."""
        if self._c.literal is None:
            return chunk
        data = self._carry + chunk
        # Hold back the longest tail that could start a match: the next read may complete it
        # (also when it already holds a shorter match that a longer form extends).
        held = self._held(data)
        if self._c.runs and held < len(data) and data[-held - 1] in base64run.BASE64_BYTES:
            # the byte before a base64 spelling (one the next read may start) may be its boundary
            # character, re-encoded with it unless it ends an escape: held with the 5 bytes
            # before it that tell (proxy/core/base64run.py), so the output does not depend on the cut
            held = min(len(data), held + 1 + base64run.CONTEXT)
        out, cut = self._scan(data, len(data) - held)
        self._carry = data[cut:]
        return out

    def finish(self) -> bytes:
        """The held-back tail at the end of the stream, scrubbed."""
        rest, self._carry = self._carry, b""
        return self.scrub(rest)

    def scrub_name(self, name: bytes) -> bytes:
        """Scrub a header (or trailer) name: as a value, and then case-insensitively for the raw
        secrets, since field names are case-insensitive (RFC 9110 §5.1) and HTTP/2 sends them
        lower-cased (RFC 9113 §8.2.1). A name that held a secret comes back lower-cased."""
        out = self.scrub(name)
        folded = self._c.folded
        if folded is not None and folded.literal is not None:
            low = out.lower()
            if folded.literal.search(low) is not None:
                return Scrubber((), compiled=folded).scrub(low)
        return out

    def scrub(self, data: bytes) -> bytes:
        """Scrub a whole value at once (a header value)."""
        c = self._c
        if c.literal is None:
            return data
        # most header values hold neither a plain spelling nor an escape: two C scans say so
        if c.literal.search(data) is None and not (c.kinds and c.escape.search(data)):
            return data
        return self._scan(data, len(data))[0]
