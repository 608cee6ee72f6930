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

import bisect
import dataclasses
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import ahocorasick_rs

from proxy.core import base64run
from proxy.core.scrubforms import ESCAPE, KINDS, OPEN_ESCAPE, View, secret_spellings, unescape

ESCAPE_LIKE = re.compile(rb"%[0-9A-Fa-f]{2}|\\|\+")  # text an escaped view decodes
_EXPANSION = 12  # original bytes per decoded byte at most (a surrogate pair: 12 for 4 bytes)


class Literals:
    """Leftmost-longest search for many byte strings at once: one Aho-Corasick automaton of the
    Rust ``aho-corasick`` crate (ahocorasick-rs, ``MATCHKIND_LEFTMOST_LONGEST``: among the matches
    that start leftmost, the longest; a secret that contains another is replaced whole).

    One mechanism for any number of strings (issue 19). It replaced three tiers: ``bytes.find``
    per string up to 32, a longest-first ``re`` alternation up to 512, pyahocorasick beyond, whose
    cost fell off a cliff between them: measured in process over a 256 KiB read of text, 1,643
    MB/s for 1 credential (4 spellings) and 62 MB/s for 10 (40 spellings, the alternation), where
    the automaton does 7,043 and 271; 8 against 337 MB/s for 100. For 60,000 spellings (10,000
    secrets) it builds in 1.3 s against 2.8 s and holds 52 MB of RSS against 120.

    ``search`` is asked again and again over the same read at growing positions (the scrubber
    goes on after each match): the automaton runs once over the rest of the read and the matches
    are kept, as long as the same object (bytes are immutable) is searched from at or after where
    that run began. An answer is taken from them unless ``pos`` falls inside a kept match, where
    a match may start that the run skipped; then a window of that match's length plus the
    longest string is searched. The two last searched objects are kept: the read and the small
    decoded window around an escape (:meth:`proxy.core.scrub.Scrubber._next` alternates them).
    """

    __slots__ = ("_automaton", "_longest", "_kept")

    def __init__(self, spellings: Iterable[bytes]) -> None:
        words = sorted(set(spellings))
        if not words or not all(words):
            raise ValueError("Literals needs one or more non-empty strings")
        self._automaton = ahocorasick_rs.BytesAhoCorasick(
            words, matchkind=ahocorasick_rs.MATCHKIND_LEFTMOST_LONGEST
        )
        self._longest = max(map(len, words))
        # (data, where the run began, its matches, their starts), most recent first
        self._kept: list[tuple[bytes, int, list[tuple[int, int]], list[int]]] = []

    def _matches(self, data: bytes, pos: int, end: int | None = None) -> list[tuple[int, int]]:
        view = memoryview(data)[pos:end]
        return [(pos + s, pos + e) for _, s, e in self._automaton.find_matches_as_indexes(view)]

    def search(self, data: bytes, pos: int = 0) -> tuple[int, int] | None:
        """(start, end) of the leftmost-longest string in ``data[pos:]``, or None."""
        if pos >= len(data):
            return None
        kept = self._kept
        for i, entry in enumerate(kept):
            if entry[0] is data and entry[1] <= pos:
                if i:
                    kept.insert(0, kept.pop(i))
                break
        else:
            found = self._matches(data, pos)
            entry = (data, pos, found, [s for s, _ in found])
            if type(data) is bytes:  # immutable: the same object is the same bytes later
                kept.insert(0, entry)
                del kept[2:]
        _, _, found, starts = entry
        k = bisect.bisect_left(starts, pos)
        if k and found[k - 1][1] > pos:
            # ``pos`` is inside a kept match: the run went on from its end, so a match starting
            # in [pos, its end) was not sought. Every string starting there ends inside the
            # window; the window's first match, if it starts there, is the answer.
            inside = found[k - 1][1]
            for s, e in self._matches(data, pos, inside - 1 + self._longest)[:1]:
                if s < inside:
                    return s, e
        return found[k] if k < len(found) else None

    def finditer(self, data: bytes) -> Iterator[tuple[int, int]]:
        """(start, end) of each leftmost-longest string in ``data``, left to right."""
        return iter(self._matches(data, 0))


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
    # (what comes before, the open escape it ends in) for each spelling that ends like the head
    # of an escape (``abc%``, ``x\\u0``: a secret that holds ``%`` or a backslash); text after
    # it may complete that escape (``abc%41``), see Scrubber._inside
    open_ended: tuple[tuple[bytes, bytes], ...] = ()


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


def _open_ended(spellings: Iterable[bytes]) -> tuple[tuple[bytes, bytes], ...]:
    """``Compiled.open_ended`` of ``spellings``."""
    out = []
    for spelling in spellings:
        if (m := OPEN_ESCAPE.search(spelling)) is not None and m.start() > 0:
            out.append((spelling[: m.start()], spelling[m.start() :]))
    return tuple(sorted(out))


def _assemble(
    spellings: dict[bytes, bytes],
    runs: dict[bytes, base64run.Run],
    ordered: list[bytes],
    literal: Search | None,
    made_of: frozenset[int],
    starts: frozenset[int],
    raw_longest: int,
    escapes: bool,
    open_ended: tuple[tuple[bytes, bytes], ...],
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
        # a one-byte escape of a byte no spelling holds is never sought (see scrubheads.Heads)
        kinds=tuple(k for k in KINDS if len(k) != 2 or k[1] in made_of) + ((b"+",) if spaces else ())
        if escapes
        else (),
        views=tuple(views),
        first=_byte_class(starts),
        longest=raw_longest * (_EXPANSION if escapes else 1),
        made_of=made_of,
        non_ascii=non_ascii,
        starts=starts,
        open_ended=open_ended if escapes else (),
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
    made_of = frozenset(b"".join(spellings))
    base = _assemble(
        spellings,
        runs,
        sorted(spellings),
        Literals(spellings) if spellings else None,
        made_of,
        frozenset(s[0] for s in spellings),
        max(map(len, spellings), default=0),
        escapes,
        _open_ended(spellings) if escapes and (0x25 in made_of or 0x5C in made_of) else (),
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
    open_ended = tuple(sorted({*kept.open_ended, *added.open_ended}))
    base = _assemble(spellings, runs, ordered, Either(kept.literal, added.literal),
                     kept.made_of | added.made_of, kept.starts | added.starts, raw, escapes,
                     open_ended)  # fmt: skip
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
