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
from typing import Any, Protocol

import ahocorasick  # type: ignore[import-not-found]  # no stubs

from proxy.core import base64run
from proxy.core.scrubforms import ESCAPE, KINDS, View, secret_spellings, unescape

_NEVER = 1 << 62  # a search start past any data: "not searched yet"
_FIND_LIMIT = 32  # strings: up to this, one bytes.find per string (see Literals)
_RE_LIMIT = 512  # strings: past this, an automaton (see Literals)
ESCAPE_LIKE = re.compile(rb"%[0-9A-Fa-f]{2}|\\|\+")  # text an escaped view decodes
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
        self._families = _families(self._words)  # see _find
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
        # One bytes.find per family of words (a word and the longer ones it is a prefix of: a
        # base64 spelling padded, unpadded and cut short), since every member starts with its
        # root: the family's leftmost match is at its root's next occurrence, and there it is
        # the longest member that starts there (issue 19: 4 searches per read instead of 6).
        # Each root's next occurrence is kept while the same data is searched at growing
        # positions, so a body full of matches costs one pass per root, not one per match.
        # (Bytes are immutable: the same object is the same data.) A root's entry is (where its
        # search started, what it found); it answers a search from ``pos`` when it started at or
        # before ``pos`` and found nothing, or found an occurrence at or after ``pos``.
        families = self._families
        if self._found is None or self._found[0] is not data:
            self._found = (data, [(_NEVER, -1)] * len(families))
        known = self._found[1]
        best: tuple[int, int] | None = None
        for i, (root, members) in enumerate(families):
            since, j = known[i]
            if since > pos or 0 <= j < pos:
                j = data.find(root, pos)
                known[i] = (pos, j)
            if j < 0 or (best is not None and j > best[0]):
                continue
            length = next(len(w) for w in members if data.startswith(w, j))  # the root at least
            if best is None or j < best[0] or length > best[1] - best[0]:
                best = (j, j + length)
        return best

    def finditer(self, data: bytes) -> Iterator[tuple[int, int]]:
        """(start, end) of each leftmost-longest string in ``data``, left to right."""
        if self._rx is not None:
            for m in self._rx.finditer(data):
                yield m.start(), m.end()
            return
        for last, length in self._automaton.iter_long(data.decode("latin-1")):
            yield last + 1 - length, last + 1


def _families(words: tuple[bytes, ...]) -> tuple[tuple[bytes, tuple[bytes, ...]], ...]:
    """``words`` grouped under their shortest prefix among them: (root, members longest first,
    the root last). A word belongs to the shortest word that is a prefix of it."""
    by_root: dict[bytes, list[bytes]] = {}
    for w in sorted(words, key=len):
        root = next((r for r in by_root if w.startswith(r)), w)
        by_root.setdefault(root, []).append(w)
    return tuple((root, tuple(sorted(ms, key=len, reverse=True))) for root, ms in by_root.items())


class Search(Protocol):
    """A leftmost-longest search over a set of spellings (:class:`Literals`, :class:`Either`)."""

    def search(self, data: bytes, pos: int = 0) -> tuple[int, int] | None: ...
    def finditer(self, data: bytes) -> Iterator[tuple[int, int]]: ...


@dataclass(frozen=True, slots=True)
class Compiled:
    """A set of pairs compiled (:func:`compile_pairs`): every plain spelling with its replacement,
    the search over them, and the tables the streaming scrubber reads (escape kinds, views,
    the bound on what it holds back). ``binary`` and ``folded`` are the same pairs compiled for
    binary bodies and for header names."""

    spellings: dict[bytes, bytes]
    runs: dict[bytes, base64run.Run]  # the base64 spellings among them (proxy/core/base64run.py)
    ordered: list[bytes]  # sorted, for prefix tests by binary search
    literal: Search | None
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
    starts: frozenset[int] = frozenset()  # the bytes spellings start with (``first``'s class)


def _byte_class(values: Iterable[int]) -> re.Pattern[bytes]:
    """A pattern matching any one of the byte ``values`` (none: never)."""
    members = b"".join(re.escape(bytes([b])) for b in sorted(values))
    return re.compile(b"[" + members + b"]" if members else b"(?!)")


def _gather(
    pairs: tuple[tuple[bytes, bytes], ...], escapes: bool
) -> tuple[dict[bytes, bytes], dict[bytes, base64run.Run]]:
    """Every plain spelling of ``pairs`` with its replacement, and the base64 ones' runs (the
    first pair with a spelling wins it)."""
    spellings: dict[bytes, bytes] = {}
    runs: dict[bytes, base64run.Run] = {}
    for secret, placeholder in pairs:
        if secret:
            forms, secret_runs = (
                secret_spellings(secret, placeholder) if escapes else ({secret: placeholder}, {})
            )
            if escapes:
                forms = _readings(forms)
            for s, r in forms.items():
                if s not in spellings:
                    spellings[s] = r
                    if s in secret_runs:
                        runs[s] = secret_runs[s]
    return spellings, runs


def _readings(forms: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``forms`` (one secret's spellings) and, for a spelling that itself holds escape-like text
    (a literal ``%00``, ``+``, ``\\u0041``), what each escaped view reads it as, with the same
    replacement: the views decode that text too, so the decoded window of an echo whose other
    bytes a server escaped would never hold the spelling (a hypothesis case: ``000\xa0%00``
    per-byte JSON-escaped). Every view is tried, whether or not the set of secrets turns it on,
    so a secret's readings do not depend on the others (:func:`extend` equals compiling all)."""
    out = dict(forms)
    for spelling, placeholder in forms.items():
        if ESCAPE_LIKE.search(spelling):
            for view in _ALL_VIEWS:
                read = unescape(spelling, 0, len(spelling), view)[0]
                if read and read != spelling:
                    out.setdefault(read, placeholder)
    return out


_ALL_VIEWS: tuple[View, ...] = (
    (False, False, False), (True, False, False), (False, True, False),
    (False, False, True), (False, True, True),
)  # fmt: skip


def _assemble(
    spellings: dict[bytes, bytes],
    runs: dict[bytes, base64run.Run],
    ordered: list[bytes],
    literal: Search | None,
    made_of: frozenset[int],
    starts: frozenset[int],
    raw_longest: int,
    escapes: bool,
) -> Compiled:
    """The tables of a set of spellings, from what is known of them as a whole (the bytes they
    are made of, their first bytes, the longest), so that :func:`extend` need not walk them."""
    spaces = escapes and 0x20 in made_of
    backslash = escapes and 0x5C in made_of
    non_ascii = bool(made_of) and max(made_of) >= 0x80
    views: list[View] = (
        [(False, False, False)]
        + [(True, False, False)] * spaces
        + [(False, True, False)] * backslash
        + [(False, backslash, True)]
        * (escapes and non_ascii)  # per-byte JSON escapes a backslash as JSON does
    )
    return Compiled(
        spellings=spellings,
        runs=runs,
        ordered=ordered,
        # leftmost-longest: a secret that contains another is replaced whole
        literal=literal,
        escape=re.compile(ESCAPE + (rb"|\+" if spaces else b"")),
        # a one-byte escape of a byte no spelling holds is never sought (see Scrubber._may_matter)
        kinds=tuple(k for k in KINDS if len(k) != 2 or k[1] in made_of) + ((b"+",) if spaces else ())
        if escapes
        else (),
        views=tuple(views),
        first=_byte_class(starts),
        longest=raw_longest * (_EXPANSION if escapes else 1),
        made_of=made_of,
        non_ascii=non_ascii,
        starts=starts,
    )


def _variants(base: Compiled, folded: Compiled) -> Compiled:
    # (+1: a complete spelling that ends a read is held, so the byte after it, a base64 boundary
    # character maybe, is seen with it whatever the cut)
    plain = dataclasses.replace(
        base, kinds=(), views=((False, False, False),), longest=base.longest // _EXPANSION + 1
    )
    return dataclasses.replace(base, binary=plain, folded=folded)


@functools.lru_cache(maxsize=64)
def _compile(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool) -> Compiled:
    """The patterns for ``pairs``, built once per set of pairs."""
    spellings, runs = _gather(pairs, escapes)
    base = _assemble(
        spellings,
        runs,
        sorted(spellings),
        Literals(spellings) if spellings else None,
        frozenset(b"".join(spellings)),
        frozenset(s[0] for s in spellings),
        max(map(len, spellings), default=0),
        escapes,
    )
    if not escapes:
        return base
    return _variants(base, _compile(tuple((s.lower(), p.lower()) for s, p in pairs if s), False))


class Either:
    """The leftmost-longest match of two searches (a kept one and a small one added to it)."""

    def __init__(self, first: Search, second: Search) -> None:
        self._first, self._second = first, second

    def search(self, data: bytes, pos: int = 0) -> tuple[int, int] | None:
        a, b = self._first.search(data, pos), self._second.search(data, pos)
        if a is None or b is None:
            return a if b is None else b
        return a if (a[0], -a[1]) <= (b[0], -b[1]) else b

    def finditer(self, data: bytes) -> Iterator[tuple[int, int]]:
        pos = 0
        while (m := self.search(data, pos)) is not None:
            yield m
            pos = m[1]


def _combine(kept: Compiled, added: Compiled, escapes: bool) -> Compiled:
    """What ``_compile(added's pairs + kept's pairs)`` gives (``added``'s replacement wins a
    spelling both hold), in C-level copies of ``kept``'s tables plus the work of ``added``'s."""
    if added.literal is None:
        return kept
    if kept.literal is None:
        return added
    spellings = kept.spellings | added.spellings
    runs = kept.runs | added.runs
    for s in added.spellings.keys() & kept.runs.keys() - added.runs.keys():
        del runs[s]  # a spelling added as plain text that was a base64 run of a kept secret
    ordered = sorted(kept.ordered + [s for s in added.ordered if s not in kept.spellings])  # two runs
    raw = max(kept.longest, added.longest) // (_EXPANSION if escapes else 1)
    base = _assemble(spellings, runs, ordered, Either(kept.literal, added.literal),
                     kept.made_of | added.made_of, kept.starts | added.starts, raw, escapes)  # fmt: skip
    if not escapes:
        return base
    assert kept.folded is not None and added.folded is not None
    return _variants(base, _combine(kept.folded, added.folded, False))


def extend(kept: Compiled, pairs: tuple[tuple[bytes, bytes], ...]) -> Compiled:
    """``kept`` (from :func:`compile_pairs`) matching ``pairs`` too: what ``compile_pairs(pairs
    + kept's pairs)`` matches, in the time of ``pairs`` and of C-level copies of ``kept``'s
    tables (its search is kept, a second one runs over the new spellings: a claim's 10,000
    secrets are not compiled again for one credential added or replaced, issue 14)."""
    return _combine(kept, _compile(pairs, True), True)


def compile_pairs(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool = True) -> Compiled:
    """The compiled patterns of ``pairs`` (cached; empty secrets are ignored), to hand to
    :class:`proxy.core.scrub.Scrubber` again. ``escapes=False`` matches the raw secrets only."""
    return _compile(pairs, escapes)
