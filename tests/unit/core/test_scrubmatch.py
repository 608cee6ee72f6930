"""proxy.core.scrubmatch: the compiled matcher of the scrubber (its search over many strings)."""

from __future__ import annotations

import base64
import json
import re
import time
from urllib.parse import quote_from_bytes

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.core.scrub import Scrubber
from proxy.core.scrubmatch import Compiled, Literals, compile_pairs, extend


@settings(max_examples=300)
@given(
    words=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=8, unique=True),
    data=st.binary(max_size=200),
    starts=st.lists(st.integers(min_value=0, max_value=210), max_size=8),
)
def test_the_find_search_agrees_with_the_alternation(
    words: list[bytes], data: bytes, starts: list[int]
) -> None:
    """``Literals`` runs its automaton once over the rest of the data and keeps the matches; from
    any start, in any order (a kept answer must never skip an occurrence, nor one that starts
    inside a kept match), it gives what a longest-first ``re`` alternation gives."""
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


_SECRETS = st.text(alphabet='ab+/= \\"%é\u2603xyZ09', min_size=1, max_size=14).map(lambda s: s.encode())
_PAIRS = st.lists(st.tuples(_SECRETS, st.sampled_from([b"surr_PH1", b"surr_PH2", b"surr_PH3"])), max_size=5)


def _tables(c: Compiled | None) -> tuple[object, ...] | None:
    """A compiled set's tables (its search compared by what it finds, below)."""
    if c is None:
        return None
    return (c.spellings, c.runs, c.ordered, c.escape.pattern, c.kinds, c.views, c.first.pattern,
            c.longest, c.made_of, c.non_ascii, c.starts, c.literal is None,
            _tables(c.binary), _tables(c.folded))  # fmt: skip


@settings(max_examples=300, deadline=None)
# an added secret that is, raw, a kept secret's base64 spelling: a run no more
@example(kept=[(b"abcdefghij", b"surr_PH1")], data=[b"x"],
         added=[(b"YWJjZGVmZ2hpag==", b"surr_PH2"), (b"YWJjZGVmZ2hpag", b"surr_PH3")])  # fmt: skip
@given(kept=_PAIRS, added=_PAIRS, data=st.lists(st.one_of(_SECRETS, st.binary(max_size=8)), max_size=8))
def test_extend_equals_compiling_the_added_pairs_before_the_kept_ones(
    kept: list[tuple[bytes, bytes]], added: list[tuple[bytes, bytes]], data: list[bytes]
) -> None:
    """``extend`` (issue 14: a claim's 10,000 secrets are not compiled again for one credential
    written) holds the same tables as compiling all the pairs, the added ones first (their
    placeholder wins a spelling both hold), and scrubs every text, raw and escaped, alike."""
    whole = compile_pairs((*added, *kept))
    extended = extend(compile_pairs(tuple(kept)), tuple(added))
    assert _tables(extended) == _tables(whole)
    body = b"".join(data) + b" " + b" ".join(s for s, _ in (*kept, *added))
    for text in (body, quote_from_bytes(body).encode(), json.dumps(body.decode("utf-8", "replace")).encode(),
                 base64.b64encode(body)):  # fmt: skip
        for escapes in (whole, whole.binary):
            other = extended if escapes is whole else extended.binary
            assert escapes is not None and other is not None
            assert Scrubber((), compiled=other).scrub(text) == Scrubber((), compiled=escapes).scrub(text)
    if whole.literal is not None:
        assert extended.literal is not None
        assert list(extended.literal.finditer(body)) == list(whole.literal.finditer(body))


def test_extend_searches_10000_kept_secrets_and_the_added_one_without_compiling_them_again() -> None:
    kept = tuple(
        (f"KeptSecretValue{n:05d}xyz".encode(), f"surr_Kept{n:021d}".encode()) for n in range(10_000)
    )
    base = compile_pairs(kept)
    t0 = time.process_time()
    extended = extend(base, ((b"AddedSecretValue00001xyz", b"surr_Added"),))
    cpu = time.process_time() - t0
    text = b"a KeptSecretValue04242xyz b AddedSecretValue00001xyz c"
    assert Scrubber((), compiled=extended).scrub(text) == b"a surr_Kept000000000000000004242 b surr_Added c"
    assert extended.literal is not None and base.literal is not None
    print(f"extend 10,000 kept secrets by one: {cpu * 1000:.1f} ms CPU")


@settings(max_examples=300)
@given(
    words=st.lists(st.binary(min_size=1, max_size=6).map(lambda b: bytes(c % 3 + 97 for c in b)),
                   min_size=1, max_size=8, unique=True),
    data=st.binary(max_size=200).map(lambda b: bytes(c % 3 + 97 for c in b)),
    starts=st.lists(st.integers(min_value=0, max_value=210), max_size=8),
)  # fmt: skip
def test_words_that_are_prefixes_and_overlaps_of_others_agree(
    words: list[bytes], data: bytes, starts: list[int]
) -> None:
    """Over three letters most words are prefixes and overlaps of others (as base64 spellings
    padded, unpadded and cut short are), and most starts fall inside a kept match: the same
    leftmost-longest answers as the alternation."""
    literals = Literals(words)
    rx = re.compile(b"|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
    for pos in [*starts, 0, *sorted(starts)]:
        m = rx.search(data, pos)
        assert literals.search(data, pos) == ((m.start(), m.end()) if m else None)


@settings(max_examples=300)
@given(
    words=st.lists(st.binary(min_size=1, max_size=5).map(lambda b: bytes(c % 2 + 97 for c in b)),
                   min_size=1, max_size=6, unique=True),
    blobs=st.lists(st.binary(max_size=120).map(lambda b: bytes(c % 2 + 97 for c in b)), min_size=1,
                   max_size=4),
    asks=st.lists(st.tuples(st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=125)),
                  max_size=30),
)  # fmt: skip
def test_searches_of_several_objects_interleaved_agree_with_the_alternation(
    words: list[bytes], blobs: list[bytes], asks: list[tuple[int, int]]
) -> None:
    """The scrubber alternates searches of a read and of decoded windows, and several
    connections share one compiled set: searches of up to four objects (some equal in value,
    never the same object) in any order, from any start, are each what the alternation finds."""
    literals = Literals(words)
    rx = re.compile(b"|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))
    objects = [bytes(bytearray(b)) for b in blobs]  # distinct objects, even when equal
    for which, pos in asks:
        data = objects[which % len(objects)]
        m = rx.search(data, pos)
        assert literals.search(data, pos) == ((m.start(), m.end()) if m else None), (data, pos)
    for data in objects:
        assert list(literals.finditer(data)) == [(m.start(), m.end()) for m in rx.finditer(data)]


def test_many_strings_agree_with_the_alternation_and_a_mutable_buffer_is_never_kept() -> None:
    """One mechanism for any number of strings (the three tiers it replaced switched at 32 and
    512): 2,000 spellings of 500 secrets, searched from every 7th byte of a body that holds them
    at every offset, agree with the alternation. A bytearray changed between two searches is
    searched as it is now (only immutable bytes are kept between searches)."""
    secrets = [f"sk-{i:04d}-{'q' * (i % 9)}".encode() for i in range(500)]
    words = [w for s in secrets for w in (s, s.upper(), base64.b64encode(s)[2:-2], s[:-1] + b"%")]
    literals = Literals(words)
    rx = re.compile(b"|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True)))
    body = b"".join(b"." * (i % 5) + w for i, w in enumerate(words[::3])) + b"tail"
    for pos in range(0, len(body), 7):
        m = rx.search(body, pos)
        assert literals.search(body, pos) == ((m.start(), m.end()) if m else None)
    buffer = bytearray(b"....sk-0001-q....")
    assert literals.search(buffer) == (4, 13)  # type: ignore[arg-type]
    buffer[4:13] = b"........."
    assert literals.search(buffer) is None  # type: ignore[arg-type]
