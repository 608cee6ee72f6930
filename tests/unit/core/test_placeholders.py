"""proxy.core.placeholders: the recognisable format, generation, and scanning bytes for placeholders."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import placeholders
from proxy.core.placeholders import find, generate, is_placeholder

_ALNUM = string.ascii_letters + string.digits
P16 = "surr_" + "A1" * 8
P64 = "surr_" + "z9" * 32
DOC_EXAMPLE = "surr_4fQ9xT2LmB7pR1sK8vN3wY6zA0cE5hJd"


def test_prefix_is_surr_underscore() -> None:
    assert placeholders.PREFIX == "surr_"


IS_PLACEHOLDER = [
    (DOC_EXAMPLE, True, "docstring-example"),
    (P16, True, "16-characters-minimum"),
    (P64, True, "64-characters-maximum"),
    ("surr_" + "A" * 15, False, "15-characters-too-short"),
    ("surr_" + "A" * 65, False, "65-characters-too-long"),
    ("surr_", False, "prefix-only"),
    ("SURR_" + "A" * 20, False, "prefix-is-case-sensitive"),
    ("surr-" + "A" * 20, False, "wrong-separator"),
    ("surr_" + "A" * 10 + "_" + "A" * 10, False, "underscore-in-body"),
    ("surr_" + "A" * 10 + "-" + "A" * 10, False, "hyphen-in-body"),
    ("surr_" + "٣" * 20, False, "non-ascii-digits"),
    ("surr_" + "é" * 20, False, "non-ascii-letters"),
    (P16 + "\n", False, "trailing-newline"),
    (" " + P16, False, "leading-space"),
    ("Bearer " + P16, False, "embedded-is-not-exact"),
]


@pytest.mark.parametrize(
    ("text", "expected"), [r[:2] for r in IS_PLACEHOLDER], ids=[r[2] for r in IS_PLACEHOLDER]
)
def test_is_placeholder_only_for_exactly_one_placeholder(text: str, expected: bool) -> None:
    assert is_placeholder(text) is expected


@pytest.mark.parametrize("length", [16, 32, 64], ids=["min", "default", "max"])
def test_generate_makes_a_placeholder_of_the_requested_length(length: int) -> None:
    ph = generate(length)
    assert is_placeholder(ph)
    assert len(ph) == len("surr_") + length
    assert set(ph[len("surr_") :]) <= set(_ALNUM)


def test_generate_defaults_to_32_characters() -> None:
    assert len(generate()) == len("surr_") + 32


@pytest.mark.parametrize("length", [0, 15, 65], ids=["zero", "too-short", "too-long"])
def test_generate_refuses_lengths_outside_16_to_64(length: int) -> None:
    with pytest.raises(ValueError, match="16..64"):
        generate(length)


def test_generate_gives_fresh_values() -> None:
    assert len({generate() for _ in range(50)}) == 50


FIND = [
    (b"", [], "empty"),
    (b"Bearer ghp_realtoken", [], "no-prefix"),
    (f"Bearer {P16}".encode(), [P16], "bearer-header"),
    (P64.encode(), [P64], "whole-value"),
    (f'{{"token":"{P16}"}}'.encode(), [P16], "inside-json"),
    (f"/repos?key={P16}&x=1".encode(), [P16], "inside-query"),
    (f"{P16},{P64}".encode(), [P16, P64], "two-left-to-right"),
    (b"surr_" + b"A" * 15 + b" ", [], "too-short"),
    (b"surr_" + b"A" * 65, [], "too-long-run-is-not-truncated"),
    (P16.encode() + b"x", [P16 + "x"], "trailing-letter-belongs-to-the-run"),
    (P64.encode() + b"x", [], "followed-by-letter-past-64"),
    (P64.encode() + b"7", [], "followed-by-digit-past-64"),
    (P16.encode() + b"_x", [P16], "followed-by-underscore"),
    (P16.encode() + b"\xff", [P16], "followed-by-non-ascii-byte"),
    (b"surr_surr_" + b"B" * 16, [b"surr_" + b"B" * 16], "prefix-repeated"),
]


@pytest.mark.parametrize(("value", "expected"), [r[:2] for r in FIND], ids=[r[2] for r in FIND])
def test_find_returns_every_placeholder_run_left_to_right(value: bytes, expected: list[str | bytes]) -> None:
    want = [e if isinstance(e, bytes) else e.encode() for e in expected]
    assert [m.group() for m in find(value)] == want


def test_find_reports_spans_into_the_value() -> None:
    value = f"Bearer {P16}".encode()
    (m,) = find(value)
    assert (m.start(), m.end()) == (7, len(value))


_ALNUM_BYTES = frozenset(_ALNUM.encode())
_body = st.text(alphabet=_ALNUM, min_size=16, max_size=64)
_placeholder = _body.map(lambda b: "surr_" + b)
_separator = st.binary(min_size=1, max_size=12).filter(lambda b: not _ALNUM_BYTES & set(b))


@given(
    st.binary(max_size=300)
    | st.lists(st.sampled_from([b"surr_", b"A", b"9", b" ", b"_"]), max_size=120).map(b"".join)
)
def test_find_never_returns_a_run_that_is_not_a_full_placeholder(value: bytes) -> None:
    for m in find(value):
        run = m.group()
        assert value[m.start() : m.end()] == run
        assert is_placeholder(run.decode("ascii"))
        assert m.end() == len(value) or value[m.end()] not in _ALNUM_BYTES


@given(
    st.lists(_placeholder, min_size=1, max_size=5),
    st.lists(_separator, min_size=6, max_size=6),
    st.booleans(),
)
def test_find_finds_every_embedded_placeholder_between_separators(
    phs: list[str], seps: list[bytes], edges: bool
) -> None:
    assert all(is_placeholder(p) for p in phs)
    inner = [seps[i + 1] for i in range(len(phs) - 1)]
    value = seps[0] if edges else b""
    for i, ph in enumerate(phs):
        value += ph.encode() + (inner[i] if i < len(inner) else b"")
    value += seps[-1] if edges else b""
    assert [m.group().decode() for m in find(value)] == phs


def test_find_finds_generated_placeholders_in_a_header_value() -> None:
    phs = [generate(n) for n in (16, 32, 64)]
    value = f"a={phs[0]}; b={phs[1]}\t{phs[2]}".encode()
    assert [m.group().decode() for m in find(value)] == phs


@pytest.mark.parametrize("length", [16, 17, 32, 64], ids=["min", "min+1", "default", "max"])
def test_generated_placeholders_carry_a_valid_checksum(length: int) -> None:
    for _ in range(50):
        p = generate(length)
        assert is_placeholder(p) and placeholders.has_valid_checksum(p)


CHECKSUM = [
    ("surr_DemoGithubPlaceholder0001", False, "hand-written-rules-file-placeholder"),
    (DOC_EXAMPLE, False, "docstring-example"),
    ("surr_" + "A" * 15, False, "not-a-placeholder"),
    ("Bearer surr_" + "A" * 20, False, "not-exactly-one"),
]


@pytest.mark.parametrize(("text", "expected"), [r[:2] for r in CHECKSUM], ids=[r[2] for r in CHECKSUM])
def test_has_valid_checksum_table(text: str, expected: bool) -> None:
    assert placeholders.has_valid_checksum(text) is expected


def test_checksum_is_fixed_and_needs_no_secret() -> None:
    """A known vector: the checksum depends on the placeholder's text alone (no key), so any
    surrogate process, and an auditor, computes the same."""
    stem = "surr_" + "a" * 26
    assert placeholders.checksum(stem) == placeholders.checksum(stem)
    assert len(placeholders.checksum(stem)) == placeholders.CHECKSUM_LENGTH
    assert placeholders.has_valid_checksum(stem + placeholders.checksum(stem))


@given(st.text(alphabet=_ALNUM, min_size=10, max_size=58), st.integers(0, 5), st.sampled_from(_ALNUM))
def test_changing_any_one_checksum_character_invalidates_it(body: str, at: int, ch: str) -> None:
    stem = "surr_" + body
    good = placeholders.checksum(stem)
    bad = good[:at] + ch + good[at + 1 :]
    assert placeholders.has_valid_checksum(stem + bad) is (bad == good)


@given(st.text(alphabet=_ALNUM, min_size=16, max_size=64))
def test_has_valid_checksum_never_raises(body: str) -> None:
    assert isinstance(placeholders.has_valid_checksum("surr_" + body), bool)
