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
  Replaced by P as it is: a placeholder is ASCII letters, digits, ``_`` and ``-`` (a template's
  prefix), which need no escaping in a URL, a form or a JSON string.
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
(:mod:`proxy.core.scrubmatch`; Python's ``re`` scans it at ~150 MB/s and compiles 10,000 secrets
in well under a second). Escaped spellings are found by decoding: within reach of an escape
sequence the data is decoded (``%XX`` to its byte, ``\\uXXXX`` and surrogate pairs to UTF-8,
``\\/ \\" \\\\``, and ``+`` to a space when a secret holds one) with a map back to the original
offsets (:mod:`proxy.core.scrubforms`), and the same alternation runs on the decoded bytes; a
match there replaces the escaped original. Whether a held tail could still grow into a match is
one binary search in the sorted spellings.

Three modules: this one, the streaming :class:`Scrubber`; :mod:`proxy.core.scrubmatch`, the
compiled matcher (:func:`compile_pairs`, :class:`Compiled`); :mod:`proxy.core.scrubforms`, the
tables of spellings, escapes and binary media types (:func:`escapes_matter`). The names callers
use are importable from here.

Pure; no I/O.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Iterable, Iterator

from proxy.core import base64run
from proxy.core.scrubforms import ESCAPE_HEAD, OPEN_ESCAPE, escapes_matter, unescape
from proxy.core.scrubmatch import Compiled, compile_pairs

__all__ = ["MIN_BASE64", "Compiled", "Scrubber", "compile_pairs", "escapes_matter"]

MIN_BASE64 = base64run.MIN_BASE64
# Escape heads checked one by one before the rest of a read is searched by the head regexes
# (_finders): at most _FEW_HEADS, or _DENSE_HEADS when they come closer than one per _DENSE_SPAN
# bytes (a read of every byte value holds 512): a step per head costs about 1 µs, the regexes
# about 100–140 µs a 256 KiB read each (timed in process with re.finditer).
_FEW_HEADS, _DENSE_HEADS, _DENSE_SPAN = 64, 16, 512


class Scrubber:
    """``pairs``: (secret, placeholder) byte strings; empty secrets are ignored.

    ``escapes=False`` matches the raw secrets only.
    """

    def __init__(
        self, pairs: Iterable[tuple[bytes, bytes]], escapes: bool = True, compiled: Compiled | None = None
    ) -> None:
        """``compiled``: what :func:`compile_pairs` returned for these pairs, kept by the caller
        (hashing 10,000 pairs to find them in the cache cost ~100 µs per response)."""
        self._c = compiled if compiled is not None else compile_pairs(tuple(pairs), escapes)
        # (data, from where, the escapes that matter from there on), see _dense_escapes
        self._found: tuple[bytes, int, list[int]] | None = None
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
                decoded, offsets = unescape(data, start, end, view)
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

        Few ``%``/``\\`` bytes (text): find each with memchr and check it. Many (binary data,
        or a text body that is not prose): past a few heads (``_FEW_HEADS``), the rest of
        ``data`` is searched by one regex per head byte for the escapes themselves
        (:meth:`_dense_escapes`), so only real escapes cost a Python step. The heads are not
        counted first: two counting passes over every read cost more than the search itself
        (issue 19, bench/download.py).
        """
        kinds_all = self._c.kinds
        if not kinds_all:
            return iter(())
        heads: tuple[bytes, ...] = (b"%", b"\\", b"+") if b"+" in kinds_all else (b"%", b"\\")
        escape, seen = self._c.escape, 0
        nxt = {h: data.find(h, pos) for h in heads}
        few: list[int] = []
        while live := [i for i in nxt.values() if i >= 0]:
            i = min(live)
            seen += 1
            if seen > _FEW_HEADS or (seen > _DENSE_HEADS and i - pos < seen * _DENSE_SPAN):
                return itertools.chain(few, self._dense_escapes(data, i))
            if escape.match(data, i) and self._may_matter(data, i):
                few.append(i)
            for h, at in nxt.items():
                if at == i:
                    nxt[h] = data.find(h, i + 1)
        return iter(few)

    def _dense_escapes(self, data: bytes, pos: int) -> Iterator[int]:
        """:meth:`_escapes` from ``pos`` on, for a read dense in escape heads: every escape of
        the claim's kinds in the rest of ``data``, found by one regex per head byte
        (:func:`_finders`: each starts with a literal byte, which ``re`` seeks in a C loop, and
        matches only the escapes :meth:`_may_matter` keeps), kept per read, so the next match in
        it starts by bisection. The iterator is C-level and copies nothing: a read of many
        matches asks again per match, and a copy of the rest each time was quadratic."""
        found = self._found
        if found is None or found[0] is not data or found[1] > pos:
            c = self._c
            # the heads differ, so no two patterns match at one position
            finders = _finders(c.kinds, c.made_of, c.non_ascii)
            at = [m.start() for rx in finders for m in rx.finditer(data, pos)]
            found = self._found = (data, pos, sorted(at))
        positions = found[2]
        return map(positions.__getitem__, range(bisect.bisect_left(positions, pos), len(positions)))

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
            open_escape = OPEN_ESCAPE.search(data, tail)
            end = open_escape.start() if open_escape else len(data)
            if open_escape:
                starts.append(end)
            # with no escape in the tail, open or whole, its decoding is the tail itself, searched
            # above (an open escape cuts the decoded window short: then it differs)
            for view in c.views if open_escape or ESCAPE_HEAD.search(data, tail, end) else ():
                decoded, offsets = unescape(data, tail, end, view)
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


_HEX = rb"[0-9A-Fa-f]"


def _digit_class(digits: Iterable[str]) -> bytes:
    """A regex class of hex ``digits``, each in either case (``[0-8Dd]``)."""
    return b"[" + "".join(sorted({c for d in digits for c in (d.upper(), d.lower())})).encode() + b"]"


def _hex_of(values: Iterable[int]) -> bytes:
    """A pattern for the bytes ``values`` as two hex digits in either case, grouped by the first
    digit (``3[0-8Dd]|4[2-9]``): one class test a digit per candidate, where an alternation of
    every byte tried each in turn (3 times slower over a JSON body's escapes)."""
    by_high: dict[str, set[str]] = {}
    for v in values:
        digits = f"{v:02x}"
        by_high.setdefault(digits[0], set()).add(digits[1])
    groups = [_digit_class(high) + _digit_class(lows) for high, lows in sorted(by_high.items())]
    return b"(?:" + b"|".join(groups) + b")"


@functools.lru_cache(maxsize=256)  # bounded: claims come and go in a long-running proxy
def _finders(
    kinds: tuple[bytes, ...], made_of: frozenset[int], non_ascii: bool
) -> tuple[re.Pattern[bytes], ...]:
    """One pattern per head byte, matching exactly where an escape of ``kinds`` starts that
    :meth:`Scrubber._may_matter` keeps (``Compiled.kinds``, ``made_of``, ``non_ascii``): ``%XX``
    and ``\\u00XX`` of a byte some spelling holds, ``\\uXXXX`` beyond ASCII when a spelling
    holds such a character, the one-byte kinds, ``+``. Overlapping starts are all found: the
    backslash kinds are a lookahead, so ``\\\\u0041`` yields both backslashes (which reading
    holds is the views' to decide).

    Why so: every pattern starts with a literal byte, which ``re`` seeks in a tight C loop, where
    one alternation of both heads steps the matcher through every byte (8 times slower over a
    256 KiB read; translating the read to a skeleton and searching it, 3 times); and escapes of
    bytes no spelling holds (a JSON body's ``\\u00e9`` and ``\\"``, a URL's ``%3A``, thousands
    per read) cost no Python step each (a JSON API body went at 60 MB/s when each was checked).
    """
    ascii_ = [b for b in made_of if b < 0x80]
    out = []
    if b"%hh" in kinds and made_of:
        out.append(re.compile(b"%" + _hex_of(made_of)))
    after = []
    if b"\\uhhhh" in kinds:
        wide = [rb"(?!00[0-7])" + _HEX + b"{4}"] if non_ascii else []
        codes = ([b"00" + _hex_of(ascii_)] if ascii_ else []) + wide
        if codes:
            after.append(b"u(?:" + b"|".join(codes) + b")")
    after += [re.escape(k[1:]) for k in kinds if len(k) == 2 and k[0] == 0x5C]
    if after:
        out.append(re.compile(rb"\\(?=" + b"|".join(after) + b")"))
    if b"+" in kinds:
        out.append(re.compile(rb"\+"))
    return tuple(out)
