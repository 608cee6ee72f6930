"""Generated spellings: any secret (ASCII or not), each character written in any of the escapes
an upstream may produce, however the stream is cut, comes back as exactly the placeholder
(proxy/core/scrub.py lists the forms; base64 is tests/unit/core/test_base64run.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.core.scrub import Scrubber

PH = b"surr_GeneratedSpellingPlace01"
CHARS = st.characters(blacklist_categories=("Cs", "Cc"), min_codepoint=0x20)


def _u(point: int, upper: bool) -> str:
    return f"\\u{point:04X}" if upper else f"\\u{point:04x}"


def _json_u(c: str, upper: bool) -> str:
    units = c.encode("utf-16-be")
    return "".join(_u(int.from_bytes(units[i : i + 2]), upper) for i in range(0, len(units), 2))


def _percent(c: str, upper: bool) -> str:
    return "".join(f"%{b:02X}" if upper else f"%{b:02x}" for b in c.encode())


@st.composite
def spelled(draw: st.DrawFn) -> tuple[str, bytes]:
    """(secret, one spelling of it): per character raw or escaped, in one of two families."""
    secret = draw(st.text(CHARS, min_size=7, max_size=24))
    out = []
    per_byte = draw(st.booleans()) and any(ord(c) > 0x7F for c in secret)
    for c in secret:
        upper = draw(st.booleans())
        if per_byte:  # a server that JSON-escapes each UTF-8 byte as if it were Latin-1
            options = [c, "".join(_u(b, upper) for b in c.encode())]
        else:
            options = [c, _percent(c, upper), _json_u(c, upper)]
        if c in '/"\\':
            options.append("\\" + c)
        if c == "\\":  # escaped text never holds a raw backslash (it would start an escape)
            options.remove(c)
            if c == " ":
                options.append("+")
        out.append(draw(st.sampled_from(options)))
    return secret, "".join(out).encode()


@settings(max_examples=500, deadline=None)
@given(spelled(), st.lists(st.integers(min_value=0, max_value=300), max_size=5))
def test_any_spelling_of_any_secret_comes_back_as_the_placeholder(
    case: tuple[str, bytes], points: list[int]
) -> None:
    secret, spelling = case
    text = b"<" + spelling + b">"
    at = sorted({p % (len(text) + 1) for p in points})
    chunks = [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]
    s = Scrubber([(secret.encode(), PH)])
    out = b"".join(s.feed(c) for c in chunks) + s.finish()
    assert out == b"<" + PH + b">", (secret, spelling)


@settings(max_examples=200, deadline=None)
@given(st.text(CHARS, min_size=7, max_size=24).filter(lambda t: any(ord(c) > 0x7F for c in t)))
@example("000\xa0%00")  # found by hypothesis: its literal "%00" was read as a NUL beside the \u escapes
@example("ab%41cdEFGH\xe9")
def test_a_non_ascii_secret_in_the_charsets_a_server_gets_wrong(secret: str) -> None:
    raw = secret.encode()
    forms = [
        raw.decode("latin-1").encode(),  # UTF-8 read as Latin-1, written as UTF-8
        json.dumps(raw.decode("latin-1")).encode()[1:-1],  # ... and JSON-escaped: per byte
    ]
    if all(ord(c) < 0x100 for c in secret):
        forms.append(secret.encode("latin-1"))
    for form in forms:
        assert Scrubber([(raw, PH)]).scrub(b"<" + form + b">") == b"<" + PH + b">", form


def test_a_header_name_holding_the_secret_in_any_case_is_scrubbed() -> None:
    """Field names are case-insensitive (RFC 9110 §5.1) and HTTP/2 lower-cases them."""
    s = Scrubber([(b"CANARYabcDEF123456", PH)])
    assert s.scrub_name(b"X-CANARYabcDEF123456") == b"X-" + PH
    assert s.scrub_name(b"x-canaryabcdef123456") == b"x-" + PH.lower()
    assert s.scrub_name(b"X-CanaryAbcDef123456-Id") == b"x-" + PH.lower() + b"-id"
    assert s.scrub_name(b"Content-Type") == b"Content-Type"


@pytest.mark.parametrize(
    ("secret", "echo"),
    [
        (b"ab%41cd-token-1", b"ab%41cd\\u002dtoken-1"),  # its "%41" kept, a "-" JSON-escaped
        (b"ab%41cd-token-1", b"ab%2541cd-token-1"),  # its "%" percent-encoded
        (b"pass+word-12345", b"pass+word\\u002d12345"),
        (b"x\\u0041y-secret9", b"x\\\\u0041y\\u002dsecret9"),  # its backslash JSON-escaped
    ],
)  # fmt: skip
def test_a_secret_holding_escape_like_text_is_scrubbed_when_the_rest_is_escaped(
    secret: bytes, echo: bytes
) -> None:
    """The escaped views decode a secret's own literal ``%41``/``+``/``\\u0041`` too; each view's
    reading of a spelling is sought as the secret (the class of the hypothesis case above)."""
    assert Scrubber([(secret, PH)]).scrub(b"<" + echo + b">") == b"<" + PH + b">", echo
