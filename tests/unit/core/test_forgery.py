"""proxy.core.forgery: placeholders with surrogate's checksum that the requesting claim does not hold."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.forgery import MAX_PLACES, find_forged
from proxy.core.placeholders import generate

MINE = generate()
OTHERS = generate()
HAND_WRITTEN = "surr_DemoGithubPlaceholder0001"  # no checksum: inert unless registered
REGISTERED = {MINE.encode(), HAND_WRITTEN.encode()}


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


CASES = [
    ([(b"Authorization", f"Bearer {MINE}".encode())], b"/", [], "own-placeholder"),
    ([(b"Authorization", f"Bearer {OTHERS}".encode())], b"/", ["header Authorization"], "other-claims"),
    ([(b"X-Api-Key", OTHERS.encode())], b"/", ["header X-Api-Key"], "any-header"),
    ([(b"Authorization", basic("x", OTHERS))], b"/", ["header Authorization"], "inside-basic"),
    ([], f"/q?key={OTHERS}".encode(), ["request target"], "query"),
    ([], f"/q?key={OTHERS.replace('_', '%5F')}".encode(), ["request target"], "percent-encoded"),
    ([(b"X-Note", b"surr_" + b"Q" * 30)], b"/", [], "shape-without-checksum"),
    ([(b"X-Note", HAND_WRITTEN.encode())], b"/", [], "registered-without-checksum"),
    ([(b"X-Note", (OTHERS + "x").encode())], b"/", [], "longer-run-is-another-string"),
    # issue 13 class 5: every spelling the violation scan reads
    ([(OTHERS.encode(), b"1")], b"/", ["a header name"], "header-name"),
    ([(b"X-Trace", base64.b64encode(b"k:" + OTHERS.encode()))], b"/", ["header X-Trace"], "base64"),
    ([(b"Cookie", f"s={OTHERS.replace('_', '%5F')}".encode())], b"/", ["header Cookie"], "percent-cookie"),
    (
        [(b"Authorization", b"Basic " + base64.urlsafe_b64encode(b"~~?:" + OTHERS.encode()).rstrip(b"="))],
        b"/",
        ["header Authorization"],
        "basic-base64url",
    ),
    ([], b"/q/" + base64.urlsafe_b64encode(OTHERS.encode()) + b"/x", ["request target"], "base64url-path"),
    ([(b"X-Note", base64.b64encode((OTHERS + "x").encode()))], b"/", [], "longer-encoded-is-another"),
]


@pytest.mark.parametrize(("fields", "target", "expected"), [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_find_forged(fields: list[tuple[bytes, bytes]], target: bytes, expected: list[str]) -> None:
    assert find_forged(fields, target, REGISTERED) == expected


def test_places_are_bounded() -> None:
    fields = [(f"X-{i}".encode(), OTHERS.encode()) for i in range(100)]
    assert len(find_forged(fields, b"/", REGISTERED)) == MAX_PLACES


def test_places_never_hold_the_string() -> None:
    fields = [(b"Authorization", f"Bearer {OTHERS}".encode()), (OTHERS.encode(), b"1")]
    places = find_forged(fields, f"/{OTHERS}".encode(), set())
    assert places and not any(OTHERS in p for p in places)


@given(
    st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=200)), max_size=5),
    st.binary(max_size=200),
)
def test_find_forged_never_raises_on_any_bytes(fields: list[tuple[bytes, bytes]], target: bytes) -> None:
    places = find_forged(fields, target, REGISTERED)
    assert len(places) <= MAX_PLACES


@given(st.sampled_from([b"Authorization", b"X-Key"]), st.text(max_size=40), st.text(max_size=40))
def test_a_forged_placeholder_is_found_whatever_surrounds_it(name: bytes, before: str, after: str) -> None:
    value = f"{before} {OTHERS} {after}".encode()
    assert find_forged([(name, value)], b"/", REGISTERED) == [f"header {name.decode()}"]
