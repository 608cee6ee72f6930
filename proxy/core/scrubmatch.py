"""The compiled matcher of :mod:`proxy.core.scrub`: a claim's (secret, placeholder) pairs turned,
once per set of pairs, into the plain spellings of every form (:mod:`proxy.core.scrubforms`) and
one leftmost-longest search over them (:class:`Literals`), with what the streaming scrubber needs
to find escaped spellings and to tell whether a held tail can still grow into a match.

Every form the scrubber catches is one plain spelling with some characters escaped, so a claim's
secrets compile to one set of plain spellings; escaped spellings are found by decoding the data
near escapes and searching the decoded bytes with the same matcher. An earlier version built an
escape-aware pattern per form: 45 s to compile for 1,000 secrets, on the event loop.

Pure; no I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ahocorasick  # type: ignore[import-not-found]  # no stubs

from proxy.core import base64run
from proxy.core.scrubforms import ESCAPE, KINDS, View, secret_spellings, unescape

_NEVER = 1 << 62  # a search start past any data: "not searched yet"
_FIND_LIMIT = 32  # strings: up to this, one bytes.find per string (see Literals)
_RE_LIMIT = 512  # strings: past this, an automaton (see Literals)
_EXPANSION = 12  # original bytes per decoded byte at most (a surrogate pair: 12 for 4 bytes)


class Literals:
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
    """A set of pairs compiled (:func:`compile_pairs`): every plain spelling with its replacement,
    the search over them, and the tables the streaming scrubber reads (escape kinds, views,
    the bound on what it holds back). ``binary`` and ``folded`` are the same pairs compiled for
    binary bodies and for header names."""

    spellings: dict[bytes, bytes]
    runs: dict[bytes, base64run.Run]  # the base64 spellings among them (proxy/core/base64run.py)
    ordered: list[bytes]  # sorted, for prefix tests by binary search
    literal: Literals | None
    escape: re.Pattern[bytes]
    kinds: tuple[bytes, ...]
    views: tuple[View, ...]  # the decodings tried (see proxy.core.scrubforms.unescape)
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
            forms, secret_runs = (
                secret_spellings(secret, placeholder) if escapes else ({secret: placeholder}, {})
            )
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
    if escapes:
        # a secret that itself holds escape-like text (a literal "%00", "+", "\\u0041") is read
        # by the escaped views as what that text decodes to, so the decoded window would never
        # hold it when a server escaped the rest: each view's reading of a spelling is sought
        # too, as the same secret (a hypothesis case, "000\xa0%00" per-byte JSON-escaped)
        for spelling, placeholder in list(spellings.items()):
            for view in views:
                read = unescape(spelling, 0, len(spelling), view)[0]
                if read != spelling and read:
                    spellings.setdefault(read, placeholder)
        joined = b"".join(spellings)
    base = Compiled(
        spellings=spellings,
        runs=runs,
        ordered=sorted(spellings),
        # leftmost-longest: a secret that contains another is replaced whole
        literal=Literals(spellings) if spellings else None,
        escape=re.compile(ESCAPE + (rb"|\+" if spaces else b"")),
        # a one-byte escape of a byte no spelling holds is never sought (see Scrubber._may_matter)
        kinds=tuple(k for k in KINDS if len(k) != 2 or k[1] in made_of) + ((b"+",) if spaces else ())
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


def compile_pairs(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool = True) -> Compiled:
    """The compiled patterns of ``pairs`` (cached; empty secrets are ignored), to hand to
    :class:`proxy.core.scrub.Scrubber` again. ``escapes=False`` matches the raw secrets only."""
    return _compile(pairs, escapes)
