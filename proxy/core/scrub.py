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
- **S next to text that looks like an escape**: a literal ``%`` or backslash before it that
  decoding would take with S's first bytes (a JSON value ``"50%ab\\u0063defgh"``), or an S that
  ends in ``%`` or a backslash before text that completes an escape (``p\\u0061ss%41`` for
  ``pass%``): the match starts or ends inside that escape (:meth:`Scrubber._inside`).
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
escaped, so a claim's secrets compile to one leftmost-longest search of plain spellings, an
Aho-Corasick automaton (:class:`proxy.core.scrubmatch.Literals`; 60,000 spellings, 10,000
secrets, build in under 2 s). Escaped spellings are found by decoding: the escapes that decode to
a byte some spelling holds are found by a second automaton (:class:`proxy.core.scrubheads.Heads`),
and within reach of one the data is decoded (``%XX`` to its byte, ``\\uXXXX`` and surrogate pairs to UTF-8,
``\\/ \\" \\\\``, and ``+`` to a space when a secret holds one) with a map back to the original
offsets (:mod:`proxy.core.scrubforms`), and the same search runs on the decoded bytes; a
match there replaces the escaped original. Whether a held tail could still grow into a match is
one binary search in the sorted spellings.

Four modules: this one, the streaming :class:`Scrubber`; :mod:`proxy.core.scrubmatch`, the
compiled matcher (:func:`compile_pairs`, :class:`Compiled`); :mod:`proxy.core.scrubforms`, the
tables of spellings, escapes and binary media types (:func:`escapes_matter`);
:mod:`proxy.core.scrubheads`, where escapes start in a read. The names callers
use are importable from here.

Pure; no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from proxy.core import base64run
from proxy.core.scrubforms import ESCAPE_HEAD, OPEN_ESCAPE, TOKENS, View, escapes_matter, unescape
from proxy.core.scrubheads import heads, straddlers
from proxy.core.scrubmatch import Compiled, compile_pairs

__all__ = ["MIN_BASE64", "Compiled", "Scrubber", "compile_pairs", "escapes_matter"]

MIN_BASE64 = base64run.MIN_BASE64
_INSIDE_ESCAPES = frozenset(b'0123456789abcdefABCDEFu/"')  # after the head of %XX, \\uXXXX, \\/, \\"


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
        # (data, from where, the escapes that matter from there on), see _escapes
        self._found: tuple[bytes, int, list[int]] | None = None
        # the bytes a spelling may start with that can stand inside an escape (see _hidden)
        self._inner = self._c.starts & _INSIDE_ESCAPES
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
        k = bisect.bisect_left(escapes, pos)
        # Windows of candidate starts, each decoded with the longest spelling past its end, that
        # double while they follow each other over a run of escapes (a match near costs a short
        # window: one per match over the rest of the run was quadratic in a read of many
        # escaped matches close together) and start again within reach of the next escape.
        start, step = pos, 2 * n
        while k < len(escapes):
            if escapes[k] - n + 1 > start:
                start, step = escapes[k] - n + 1, 2 * n
            if start >= limit:
                break
            upto = min(limit - 1, start + step - 1)
            found = self._window(data, start, min(len(data), upto + n), upto)
            if found is not None:
                return found
            start, step = upto + 1, step * 2
            k = bisect.bisect_left(escapes, start, k)
        return (lit[0], lit[1], data[lit[0] : lit[1]]) if lit else None

    def _window(self, data: bytes, start: int, end: int, last: int) -> tuple[int, int, bytes] | None:
        """The leftmost-longest escaped match that starts in ``data[start:last + 1]``, found by
        decoding ``data[start:end]`` (``end``: ``last`` plus the longest spelling at least), or
        None. A window that starts inside an escape reads its rest as it is: a match starting
        there or after it is found as it is in a window that starts before it."""
        c = self._c
        assert c.literal is not None
        found: tuple[int, int, bytes] | None = None
        # "+" is a space in a form body and itself elsewhere: each reading is tried, and the
        # leftmost, then longest, match of any reading wins (a shorter reading of the same
        # text would leave a stray escape behind)
        for view in c.views:
            decoded, offsets = unescape(data, start, end, view)
            for ms, me in c.literal.finditer(decoded):
                s, e = offsets[ms], offsets[me]
                if s > last or (found is not None and (s, -e) >= (found[0], -found[1])):
                    break
                if e > s and data[s:e] != decoded[ms:me]:  # an escaped spelling (else: plain)
                    found = (s, e, decoded[ms:me])
                    break
            inside = self._inside(data, start, end, view, decoded, offsets, last)
            if inside is not None and (found is None or (inside[0], -inside[1]) < (found[0], -found[1])):
                found = inside
        return found

    def _escapes(self, data: bytes, pos: int) -> list[int]:
        """Where the escapes that matter start in ``data``, ascending, from ``pos`` at least (the
        caller bisects): found in the rest of ``data`` by one automaton (:class:`proxy.core.scrubheads.Heads`;
        escapes of bytes no spelling holds cost no Python step) and kept per read, so the
        search from the next match on reuses them."""
        c = self._c
        if not c.kinds:
            return []
        found = self._found
        if found is None or found[0] is not data or found[1] > pos:
            found = self._found = (data, pos, heads(c.kinds, c.made_of, c.non_ascii).find(data, pos))
        return found[2]

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

    def _hidden(
        self, data: bytes, start: int, end: int, view: View, decoded: bytes, offsets: list[int]
    ) -> Iterator[tuple[int, int, bytes, int]]:
        """The starts hidden inside escapes in ``data[start:end]`` as ``view`` decodes it: for
        every escape at ``[a, b)``, each ``h`` in ``a+1..b-1`` whose byte a spelling may start
        with, with what a decoding from ``h`` reads there (``data[h:b]`` as it is, then the
        window's decoding from ``b`` on, at most ``longest`` bytes: no escape starts inside one
        but at a backslash, and those are the backslash views' to read) and the index in
        ``decoded`` where that decoding goes on: ``(h, b, text, j)``, in order of ``h``.

        Decoding reads the window from its start, so an escape that takes the first bytes of a
        spelling hides it: a literal ``%`` before ``ab\\u0063defgh`` reads as the byte 0xAB and
        then ``\\u0063defgh``. Text that holds a ``%`` (a JSON value ``50%``, a form's
        ``100%``) before a spelling, or a backslash before one that starts with ``/`` or ``"``,
        is not an escape there."""
        inner = self._inner
        if not inner:
            return
        n = self._c.longest
        for m in straddlers(view[1], inner).finditer(data, start, end):
            a, b = m.span()
            if data[a + 1] == 0x5C:  # a backslash pair hides none (the other views read it)
                continue
            j = -1
            for h in range(a + 1, b):
                if data[h] in inner:
                    if j < 0:
                        j = bisect.bisect_left(offsets, b)
                    yield h, b, data[h:b] + decoded[j : j + n], j

    def _inside(
        self,
        data: bytes,
        start: int,
        end: int,
        view: View,
        decoded: bytes,
        offsets: list[int],
        last: int,
    ) -> tuple[int, int, bytes] | None:
        """The leftmost-longest escaped match, starting at or before ``last``, that a decoding of
        the window from its start cannot show, because an escape straddles one of its ends:
        (start, end, the spelling it is), or None.

        - It starts inside an escape (:meth:`_hidden`): ``50%ab\\u0063defgh``.
        - It ends inside one: a spelling that ends like an escape's head (``abc%``, a secret
          that holds ``%`` or a backslash: ``Compiled.open_ended``) before text that completes
          it, ``\\u0061bc%41``: the bytes before the escape decode to the rest of it, from a
          byte of the window's decoding or from a start hidden inside an escape (both ends)."""
        c = self._c
        literal = c.literal
        assert literal is not None
        best: tuple[int, int, bytes] | None = None
        hidden = []
        for candidate in self._hidden(data, start, end, view, decoded, offsets):
            if candidate[0] > last:
                break
            hidden.append(candidate)
        for h, b, text, j in hidden:
            m = literal.search(text)
            if m is None or m[0] != 0:
                continue
            e = h + m[1] if m[1] <= b - h else offsets[j + m[1] - (b - h)]
            if data[h:e] != text[: m[1]]:  # an escaped spelling (a plain one the plain search finds)
                best = (h, e, text[: m[1]])
                break
        if c.open_ended:
            for token in TOKENS[view[0], view[1]].finditer(data, start, end):
                a, b = token.span()
                for before, tail in c.open_ended:
                    if len(tail) >= b - a or not data.startswith(tail, a):
                        continue
                    i = bisect.bisect_left(offsets, a)
                    if i >= len(before) and decoded[i - len(before) : i] == before:
                        s = offsets[i - len(before)]
                    else:  # both ends inside escapes: "%ab\\u0063defg%41" for "abcdefg%"
                        hid = (h for h, b, _, j in hidden if b <= a and data[h:b] + decoded[j:i] == before)
                        s = next(hid, -1)
                        if s < 0:
                            continue
                    e, spelling = a + len(tail), before + tail
                    if s > last or data[s:e] == spelling:
                        continue
                    if best is None or (s, -e) < (best[0], -best[1]):
                        best = (s, e, spelling)
        return best

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
                for h, _, text, _ in self._hidden(data, tail, end, view, decoded, offsets):
                    if self._could_start(text):
                        starts.append(h)
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
