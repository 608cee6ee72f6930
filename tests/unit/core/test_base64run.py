"""A secret inside base64, at any alignment, in either alphabet, padded or not, raw or escaped,
however the stream is cut: the scrubbed text is still valid base64 and nothing of the secret is
left in it, at any alignment (proxy/core/base64run.py)."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.scrub import Scrubber

PH = b"surr_AAAAAAAAAAAAAAAAAAAAAAAA"
# secrets from bytes that neither the placeholder, the filler nor the context use, so any pair of
# the secret's bytes found in the decoded output could only be what is left of the secret
SECRET_BYTES = st.sampled_from(list(b"!#$&()*,;<>?@[]^{|}~") + list(range(0x80, 0x100)))
CONTEXT = st.binary(max_size=8).map(lambda b: bytes(0x30 + x % 10 for x in b))  # digits only


def run(secret: bytes, chunks: list[bytes]) -> bytes:
    s = Scrubber([(secret, PH)])
    return b"".join(s.feed(c) for c in chunks) + s.finish()


def cut(text: bytes, points: list[int]) -> list[bytes]:
    at = sorted({p % (len(text) + 1) for p in points})
    return [text[a:b] for a, b in zip([0, *at], [*at, len(text)], strict=True)]


def decode(text: bytes, urlsafe: bool) -> bytes:
    """Strict decoding: raises binascii.Error unless ``text`` is valid base64 (padding added)."""
    padded = text + b"=" * (-len(text) % 4)
    return base64.b64decode(padded, altchars=b"-_" if urlsafe else None, validate=True)


def pairs_of(secret: bytes) -> set[bytes]:
    return {secret[i : i + 2] for i in range(len(secret) - 1)}


@settings(max_examples=400, deadline=None)
@given(
    # 7 bytes: see MIN_BASE64; distinct bytes: a periodic secret ("!!!!!!!") also matches one byte
    # off, in the bytes next to it (real secrets are not periodic)
    secret=st.lists(SECRET_BYTES, min_size=7, max_size=40, unique=True).map(bytes),
    prefix=CONTEXT,
    suffix=CONTEXT,
    urlsafe=st.booleans(),
    padded=st.booleans(),
    points=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    frame=st.sampled_from([(b"", b""), (b"Basic ", b"\r\n"), (b'{"t":"', b'"}'), (b"a.", b".z")]),
    escape=st.sampled_from(["raw", "percent", "json-slash"]),
)
def test_a_secret_in_a_base64_run_leaves_valid_base64_with_nothing_of_it(
    secret: bytes,
    prefix: bytes,
    suffix: bytes,
    urlsafe: bool,
    padded: bool,
    points: list[int],
    frame: tuple[bytes, bytes],
    escape: str,
) -> None:
    encoded = (base64.urlsafe_b64encode if urlsafe else base64.standard_b64encode)(prefix + secret + suffix)
    if not padded:
        encoded = encoded.rstrip(b"=")
    if escape == "percent":
        encoded = urllib.parse.quote(encoded, safe="").encode()
    elif escape == "json-slash":
        encoded = encoded.replace(b"/", b"\\/")
    text = frame[0] + encoded + frame[1]
    out = run(secret, cut(text, points))
    assert out == run(secret, [text])  # however it is cut
    assert out.startswith(frame[0]) and out.endswith(frame[1])
    body = out[len(frame[0]) : len(out) - len(frame[1])]
    body = urllib.parse.unquote_to_bytes(body) if escape == "percent" else body.replace(b"\\/", b"/")
    decoded = decode(body, urlsafe)  # valid base64
    assert not pairs_of(secret) & {decoded[i : i + 2] for i in range(len(decoded) - 1)}, decoded
    # what a client reads: its own bytes around the placeholder, stretched by 0-2 spaces
    assert decoded.startswith(prefix + PH) and decoded.endswith(suffix)
    assert decoded[len(prefix) + len(PH) : len(decoded) - len(suffix)] in (b"", b" ", b"  ")


@pytest.mark.parametrize("urlsafe", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_the_whole_encoding_alone_decodes_to_exactly_the_placeholder(urlsafe: bool, padded: bool) -> None:
    enc = base64.urlsafe_b64encode if urlsafe else base64.standard_b64encode
    for n in (6, 7, 8):
        secret = b"\xf0" * n
        text = enc(secret) if padded else enc(secret).rstrip(b"=")
        out = run(secret, [b"<" + text + b">"])
        # S's encoding without padding to drop: P's is given padded (RFC 4648 §3.2)
        expected = enc(PH) if padded or n % 3 == 0 else enc(PH).rstrip(b"=")
        assert out == b"<" + expected + b">"


@pytest.mark.parametrize(
    "escape",
    [
        lambda t: urllib.parse.quote(t.decode(), safe="").encode(),
        lambda t: json.dumps(t.decode()).replace("/", "\\/").encode(),
        lambda t: t.replace(b"+", b"\\u002b").replace(b"/", b"\\u002F"),
    ],
    ids=["percent", "json-slash", "json-u"],
)
@pytest.mark.parametrize("k", [0, 1, 2])
def test_an_escaped_base64_run_with_escaped_boundaries_decodes_to_the_placeholder(
    escape: object, k: int
) -> None:
    """The boundary characters are '+' or '/' here, so escaped: re-encoded all the same, and
    written back in their kind of escape (a percent-escaped match stays percent-escaped)."""
    secret = bytes(range(0xA0, 0xB8))  # 24 bytes, '+' and '/' in its encoding
    text = base64.standard_b64encode(b"q" * k + secret + b"zz")
    escaped = escape(text)  # type: ignore[operator]
    out = run(secret, [escaped])
    if escaped.startswith(b'"'):
        unescaped = json.loads(out).encode()
    elif b"%" in escaped:
        assert b"+" not in out and b"/" not in out  # a raw "+" would be a space in a form
        unescaped = urllib.parse.unquote_to_bytes(out)
    else:
        unescaped = out.replace(b"\\u002b", b"+").replace(b"\\u002F", b"/").replace(b"\\u002f", b"/")
        unescaped = unescaped.replace(b"\\u002B", b"+")
    assert decode(unescaped, False) == b"q" * k + PH + FILL_FOR_24 + b"zz"


FILL_FOR_24 = b" " * ((24 - len(PH)) % 3)


def test_a_run_cut_right_after_its_boundary_character_is_still_rewritten() -> None:
    """The byte before a possible base64 spelling is held back with it: it may be the boundary
    character that holds the secret's first bits."""
    secret = b"\xa5" * 12
    text = base64.standard_b64encode(b"x" + secret + b"y")
    for at in range(1, len(text)):
        out = run(secret, [text[:at], text[at:]])
        assert decode(out, False) == b"x" + PH + b" y"


def test_a_read_ending_in_a_base64_character_holds_only_its_last_6_bytes() -> None:
    """The price of re-encoding a boundary character: it may be the last byte of a read, and the
    5 before it tell whether it ends an escape. An SSE event (it ends in a blank line) is never
    held."""
    s = Scrubber([(b"\xa5" * 12, PH)])
    assert s.feed(b"data: word") == b"data"
    assert s.feed(b"s\n\n") == b": words\n\n"
    assert s.feed(b"data: one\n\n") == b"data: one\n\n"
