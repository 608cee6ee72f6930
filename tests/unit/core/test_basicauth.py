"""proxy.core.basicauth: Basic credentials (RFC 7617 §2) read as servers read them, and rebuilt
with a placeholder swapped in one part only."""

from __future__ import annotations

import base64

import pytest

from proxy.core.basicauth import decode_basic, replace, swap_basic
from proxy.core.slots import BasicPart

PH = b"surr_BasicAuthPlaceholder0001"


def _b64(text: bytes) -> bytes:
    return base64.b64encode(text)


@pytest.mark.parametrize(
    ("value", "decoded"),
    [
        (b"Basic " + _b64(b"x:" + PH), b"x:" + PH),
        (b"basic  " + _b64(b"x:" + PH), b"x:" + PH),  # scheme in any case, more whitespace
        (b"Basic " + _b64(b"x:" + PH).rstrip(b"="), b"x:" + PH),  # padding left out
        (b"Basic " + _b64(b"x:" + PH)[:8] + b" \t" + _b64(b"x:" + PH)[8:], b"x:" + PH),  # inner space
        (b"Bearer " + _b64(b"x:" + PH), None),
        (b"Basic", None),
        (b"Basic !!!!", None),
    ],
    ids=["plain", "case-and-spaces", "unpadded", "whitespace-inside", "not-basic", "no-token", "not-base64"],
)
def test_basic_credentials_are_read_leniently(value: bytes, decoded: bytes | None) -> None:
    assert decode_basic(value) == decoded


def test_replace_takes_only_a_whole_placeholder() -> None:
    assert replace(PH + b" " + PH + b"x", PH, b"SECRET") == b"SECRET " + PH + b"x"


@pytest.mark.parametrize(
    ("userpass", "part", "expected"),
    [
        (b"x:" + PH, BasicPart.PASSWORD, b"x:SECRET"),
        (PH + b":" + PH, BasicPart.PASSWORD, PH + b":SECRET"),
        (PH + b":" + PH, BasicPart.USER, b"SECRET:" + PH),
        (PH, BasicPart.USER, b"SECRET"),  # no colon: all user name (RFC 7617 §2)
        (PH, BasicPart.PASSWORD, PH),  # no password to swap in
    ],
    ids=["password", "password-only", "user-only", "no-colon-user", "no-colon-password"],
)
def test_a_swap_touches_its_part_only_and_keeps_the_scheme(
    userpass: bytes, part: BasicPart, expected: bytes
) -> None:
    name, value = swap_basic((b"Authorization", b"bAsIc " + _b64(userpass)), [(part, PH, b"SECRET")])
    assert name == b"Authorization"
    assert value == b"bAsIc " + _b64(expected)


def test_a_field_that_is_not_basic_is_left_alone() -> None:
    field = (b"Authorization", b"Bearer " + PH)
    assert swap_basic(field, [(BasicPart.PASSWORD, PH, b"SECRET")]) is field
