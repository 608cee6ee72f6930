"""proxy.core.scrubforms: the tables of spellings, escapes and binary media types."""

from __future__ import annotations

import pytest

from proxy.core import scrubforms
from proxy.core.scrubforms import escapes_matter, recoded, secret_spellings, unescape


@pytest.mark.parametrize(
    ("content_type", "text"),
    [
        ("", True),  # unknown: text
        ("text/plain; charset=utf-8", True),
        ("application/json", True),
        ("application/vnd.github+json", True),
        ("text/event-stream", True),
        ("application/x-www-form-urlencoded", True),
        ("image/svg+xml", True),
        ("not a media type", True),
        ("application/octet-stream", False),
        ("Application/Octet-Stream; name=x", False),
        ("application/x-git-upload-pack-result", False),
        ("application/gzip", False),
        ("image/png", False),
        ("video/mp4", False),
        ("font/woff2", False),
    ],
)
def test_which_bodies_are_searched_for_escaped_spellings(content_type: str, text: bool) -> None:
    assert escapes_matter(content_type) is text


@pytest.mark.parametrize(
    ("data", "view", "decoded", "offsets"),
    [
        (b"a%41b", (False, False, False), b"aAb", [0, 1, 4, 5]),
        (b"\\u0041x", (False, False, False), b"Ax", [0, 6, 7]),
        (b"a+b", (True, False, False), b"a b", [0, 1, 2, 3]),
        (b"a+b", (False, False, False), b"a+b", [0, 1, 2, 3]),
        (b"\\ud83d\\ude00", (False, False, False), "\U0001f600".encode(), [0, 0, 0, 0, 12]),
        (b"\\u00c3\\u00a9", (False, False, True), "\u00e9".encode(), [0, 6, 12]),
    ],
    ids=["percent", "json-u", "plus-space", "plus-itself", "surrogate-pair", "per-byte-utf8"],
)
def test_unescape_decodes_and_maps_each_byte_to_where_its_escape_starts(
    data: bytes, view: tuple[bool, bool, bool], decoded: bytes, offsets: list[int]
) -> None:
    assert unescape(data, 0, len(data), view) == (decoded, offsets)


def test_a_secrets_spellings_hold_its_recodings_and_base64_forms() -> None:
    secret = "SECRET\u00e9abc123".encode()
    forms, runs = secret_spellings(secret, b"surr_PH1")
    assert forms[secret] == b"surr_PH1"
    assert all(r in forms for r in recoded(secret))
    assert runs and all(text in forms for text in runs)


VIEWS = [(s, b, u) for s in (False, True) for b in (False, True) for u in (False, True)]


@pytest.mark.parametrize("view", VIEWS)
def test_the_one_byte_escape_table_decodes_as_the_tokens_do(
    view: tuple[bool, bool, bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every entry of the lookup table unescape uses (``_PIECES``) gives what decoding the token
    itself gives (``_decode``), in every view where the tokenizer matches it; and a text of
    escapes of every kind decodes, offsets included, as it does with no table at all."""
    tokens = scrubforms.TOKENS[view[0], view[1]]
    checked = 0
    for text, piece in scrubforms._PIECES[view[2]].items():
        m = tokens.fullmatch(text)
        if m is None:  # "+" or "\\" outside the views that read them
            assert text in (b"+", b"\\\\") and not (view[0] if text == b"+" else view[1])
            continue
        assert piece == scrubforms._decode(m, view), text
        checked += 1
    assert checked >= 2 * 22 * 22
    text = b"a%41\\u00e9%c3%A9\\u0042\\/x+\\\\\\ud83d\\ude00\\u20AC%zz\\\"%7e%7E\\u00FFb"
    with_table = unescape(text, 0, len(text), view), unescape(text, 3, len(text) - 2, view)
    monkeypatch.setattr(scrubforms, "_PIECES", {False: {}, True: {}})
    assert with_table == (unescape(text, 0, len(text), view), unescape(text, 3, len(text) - 2, view))
