"""Scrubbing: the output never holds a secret and does not depend on how the stream is cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.scrub import Scrubber

PAIRS = [
    (b"SECRETabc123", b"surr_PH1"),
    (b"ab", b"<ab>"),
    (b"abcd", b"<abcd>"),
    (b"abc", b"<abc>"),
    (b"cde", b"<cde>"),
]


def run(pairs: list[tuple[bytes, bytes]], chunks: list[bytes]) -> bytes:
    s = Scrubber(pairs)
    return b"".join(s.feed(c) for c in chunks) + s.finish()


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b"token=SECRETabc123;"], b"token=surr_PH1;"),
        ([b"token=SECRE", b"Tabc123;"], b"token=surr_PH1;"),
        ([b"xab"], b"x<ab>"),
        ([b"xab", b"cd"], b"x<abcd>"),
        ([b"xabcd"], b"x<abcd>"),
        ([b"xabc", b"de"], b"x<abcd>e"),
        ([b"data: one\n\n"], b"data: one\n\n"),
    ],
    ids=["whole", "split", "short-at-end", "short-extends-to-long", "long", "overlap", "sse"],
)
def test_rows(chunks: list[bytes], expected: bytes) -> None:
    assert run(PAIRS, chunks) == expected


def test_an_sse_event_that_cannot_start_a_secret_is_not_held_back() -> None:
    s = Scrubber([(b"SECRETabc123", b"surr_PH1")])
    assert s.feed(b"data: one\n\n") == b"data: one\n\n"


def test_only_a_possible_start_is_held_back() -> None:
    s = Scrubber([(b"SECRETabc123", b"surr_PH1")])
    assert s.feed(b"data: SEC") == b"data: "
    assert s.feed(b"OND\n") == b"SECOND\n"


@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from([b"SECRETabc123", b"ab", b"abcd", b"abc", b"cde", b"x", b"SECRET", b"c", b"\n"]),
        max_size=30,
    ),
    st.lists(st.integers(min_value=0, max_value=200), max_size=10),
)
def test_chunking_never_changes_the_output_and_no_secret_survives(
    parts: list[bytes], cuts: list[int]
) -> None:
    text = b"".join(parts)
    whole = run(PAIRS, [text])
    points = sorted({c % (len(text) + 1) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert run(PAIRS, chunks) == whole
    assert b"SECRETabc123" not in whole
