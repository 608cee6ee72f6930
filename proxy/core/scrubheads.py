"""Where escapes start in a read, for :mod:`proxy.core.scrub`: the escapes that matter (they
decode to a byte some spelling holds: :class:`Heads`), and those a spelling may start inside
(:func:`straddlers`). Built once per claim's escape tables, cached.

Pure; no I/O.
"""

from __future__ import annotations

import functools
import re

import ahocorasick_rs


def _hex_spellings(value: int) -> set[str]:
    """``value`` as two hex digits, each in either case (0x6b: 6b, 6B)."""
    digits = f"{value:02x}"
    return {a + b for a in {digits[0], digits[0].upper()} for b in {digits[1], digits[1].upper()}}


class Heads:
    """Where the escapes that matter start in a read: those that decode to a byte some spelling
    holds. Every escape inside an escaped match decodes to a byte of that match, so the windows
    decoded around these still find every match (:meth:`proxy.core.scrub.Scrubber._next`). One Aho-Corasick
    automaton (ahocorasick-rs, the Rust ``aho-corasick`` crate) of every such escape spelled out,
    ``%XX`` and ``\\u00XX`` of each byte some spelling holds in every hex case, the one-byte
    kinds, ``+``; searched with overlapping matches, so ``\\\\u0041`` yields both backslashes
    (which reading holds is the views' to decide). No two of these start at one position (their
    second bytes, or hex digits, differ). Every one starts with ``%``, ``\\`` or ``+``: the
    crate seeks those with memchr and runs the automaton only there.

    A ``\\uXXXX`` beyond ASCII matters when a spelling holds a byte >= 0x80 (``non_ascii``):
    those, too many to spell out, are found by one regex (lookahead, so it matches only the
    backslash), disjoint from the automaton's ``\\u00[0-7]X``.

    Why so: the automaton finds them 2 to 9 times faster than the one regex per head byte it
    replaced, which ``re`` steps through at ~0.5 ms per 256 KiB read, for a read of every byte
    value, an API's JSON, or JSON dense with escapes no spelling holds (``\\u00e9``, ``\\"``:
    measured in process, issue 19); and escapes of bytes no spelling holds cost no Python step.
    """

    __slots__ = ("_automaton", "_wide")

    def __init__(self, kinds: tuple[bytes, ...], made_of: frozenset[int], non_ascii: bool) -> None:
        words: set[bytes] = set()
        if b"%hh" in kinds:
            words.update(f"%{h}".encode() for v in made_of for h in _hex_spellings(v))
        if b"\\uhhhh" in kinds:
            words.update(f"\\u00{h}".encode() for v in made_of if v < 0x80 for h in _hex_spellings(v))
        words.update(k for k in kinds if len(k) == 2 and k[0] == 0x5C)
        if b"+" in kinds:
            words.add(b"+")
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(sorted(words), matchkind=ahocorasick_rs.MATCHKIND_STANDARD)
            if words
            else None
        )
        wide = b"\\uhhhh" in kinds and non_ascii
        self._wide = re.compile(rb"\\(?=u(?!00[0-7])[0-9A-Fa-f]{4})") if wide else None

    def find(self, data: bytes, pos: int) -> list[int]:
        """The start of every such escape in ``data[pos:]``, ascending."""
        at: list[int] = []
        if self._automaton is not None:
            found = self._automaton.find_matches_as_indexes(memoryview(data)[pos:], overlapping=True)
            at = [pos + start for _, start, _ in found]
        if self._wide is not None:
            at += [m.start() for m in self._wide.finditer(data, pos)]
        at.sort()  # the crate reports overlapping matches by their end
        return at


_H = rb"[0-9A-Fa-f]"


@functools.lru_cache(maxsize=256)  # bounded: claims come and go in a long-running proxy
def straddlers(backslash: bool, inner: frozenset[int]) -> re.Pattern[bytes]:
    """The escapes of :data:`proxy.core.scrubforms.TOKENS` (the view's, by ``backslash``) that
    hold, after their head, a byte of ``inner`` (:meth:`proxy.core.scrub.Scrubber._hidden`), in the order the
    tokenizer finds them: ``re`` skips the others in C (a hostile body of nothing but ``%43``
    escapes, for a secret that starts with ``C``, would cost a Python step each). A surrogate
    pair and a backslash pair are matched whole, as the tokenizer does, so that no escape is
    found inside them; the caller looks at their bytes (``\\\\`` hides none). No other escape
    holds a head byte after its own, so skipping one cannot make the search start inside it."""
    hexes = bytes(sorted(inner & frozenset(b"0123456789abcdefABCDEF")))
    i = b"[" + re.escape(hexes) + b"]" if hexes else b""
    parts = [rb"\\u[dD][89abAB]" + _H + rb"{2}\\u[dD][c-fC-F]" + _H + b"{2}"]
    if i:
        parts.append(b"%(?:" + i + _H + b"|" + _H + i + b")")
    if ord("u") in inner:
        parts.append(rb"\\u" + _H + b"{4}")
    elif i:
        at = [_H * k + i + _H * (3 - k) for k in range(4)]
        parts.append(rb"\\u(?:" + b"|".join(at) + b")")
    parts += [rb"\\" + re.escape(bytes([c])) for c in b'/"' if c in inner]
    if backslash:
        parts.append(rb"\\\\")
    return re.compile(b"|".join(parts))


@functools.lru_cache(maxsize=256)  # bounded: claims come and go in a long-running proxy
def heads(kinds: tuple[bytes, ...], made_of: frozenset[int], non_ascii: bool) -> Heads:
    """The :class:`Heads` of a claim's escape tables (``Compiled.kinds``, ``made_of``,
    ``non_ascii``), built once per set of them."""
    return Heads(kinds, made_of, non_ascii)
