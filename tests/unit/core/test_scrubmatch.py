"""proxy.core.scrubmatch: the compiled matcher of the scrubber (its search over many strings)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.scrubmatch import Literals, compile_pairs


@settings(max_examples=300)
@given(
    words=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=8, unique=True),
    data=st.binary(max_size=200),
    starts=st.lists(st.integers(min_value=0, max_value=210), max_size=8),
)
def test_the_find_search_agrees_with_the_alternation(
    words: list[bytes], data: bytes, starts: list[int]
) -> None:
    """``Literals`` searches up to _FIND_LIMIT strings with bytes.find and keeps each one's next
    occurrence; from any start, in any order (a cached answer must never skip an occurrence),
    it gives what a longest-first ``re`` alternation gives."""
    literals = Literals(words)
    rx = re.compile(b"|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
    for pos in [*starts, 0, *sorted(starts)]:
        m = rx.search(data, pos)
        assert literals.search(data, pos) == ((m.start(), m.end()) if m else None)


def test_pairs_are_compiled_once_and_empty_secrets_are_ignored() -> None:
    pairs = ((b"SECRETabc123", b"surr_PH1"), (b"", b"surr_PH2"))
    compiled = compile_pairs(pairs)
    assert compile_pairs(pairs) is compiled
    assert b"" not in compiled.spellings and compiled.spellings[b"SECRETabc123"] == b"surr_PH1"
    assert compile_pairs(((b"", b"surr_PH2"),)).literal is None
