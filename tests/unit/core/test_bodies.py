"""proxy.core.bodies: streaming placeholder swap (same output whatever the chunking), escaping, codecs."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable
from urllib.parse import parse_qs

import brotli  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import bodies, placeholders

P1 = b"surr_BodyPlaceholder000000000001"
P2 = b"surr_OtherPlaceholder00000000002"
UNREG = b"surr_NotRegisteredAnywhere000004"
SECRETS = {P1: b"<secret-one>", P2: b"<secret-two-longer-than-the-placeholder-itself>"}


def resolve(ph: bytes) -> bytes | None:
    return SECRETS.get(ph)


def whole(body: bytes) -> bytes:
    """The reference: every match over the whole body, replaced at once."""
    out, pos = [], 0
    for m in placeholders.find(body):
        r = resolve(m.group())
        if r is not None:
            out += [body[pos : m.start()], r]
            pos = m.end()
    return b"".join(out) + body[pos:]


def chunked(body: bytes, cuts: Iterable[int]) -> bytes:
    s = bodies.Swapper(resolve)
    out, prev = [], 0
    for c in sorted(set(cuts)):
        out.append(s.feed(body[prev:c]))
        prev = c
    out.append(s.feed(body[prev:]))
    out.append(s.finish())
    return b"".join(out)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"no placeholder here", id="none"),
        pytest.param(P1, id="alone"),
        pytest.param(b'{"token": "' + P1 + b'", "other": "' + P2 + b'"}', id="json-two"),
        pytest.param(P1 + b"x", id="followed-by-letter-not-one"),
        pytest.param(P1 + b"-" + P1, id="twice"),
        pytest.param(UNREG + b" " + P1, id="unregistered-left-alone"),
        pytest.param(b"surr_" + b"A" * 16 + P1[:-1], id="overlap-then-partial"),
        pytest.param(b"surr_" + b"A" * 16 + b"surr_" + b"B" * 20, id="match-ends-at-underscore"),
        pytest.param(b"surr_" + b"A" * 70, id="too-long-run"),
        pytest.param(b"s" * 200 + P1, id="many-s"),
    ],
)
def test_every_split_point_gives_the_whole_body_result(body: bytes) -> None:
    expected = whole(body)
    for i in range(len(body) + 1):
        assert chunked(body, [i]) == expected, i


def test_placeholder_at_every_read_boundary_of_64k_reads() -> None:
    read = 64 * 1024
    for shift in range(len(P1) + 1):  # the placeholder straddles the boundary by every amount
        data = b"." * (read - shift) + P1 + b"." * (read + shift)
        got = chunked(data, range(read, len(data), read))
        assert got == whole(data) == b"." * (read - shift) + SECRETS[P1] + b"." * (read + shift), shift


def test_hold_back_is_bounded() -> None:
    s = bodies.Swapper(resolve)
    s.feed(b"a" * 1000 + b"surr_" + b"Q" * 60)
    assert len(s.held) <= bodies.HOLD
    s.feed(b"b" * 10)
    assert s.held == b""


class Stop(Exception):
    pass


def test_a_refusal_stops_before_the_read_that_holds_it_is_returned() -> None:
    def refuse(ph: bytes) -> bytes | None:
        raise Stop

    s = bodies.Swapper(refuse)
    assert s.feed(b"first read, clean ") == b"first read, clean "
    with pytest.raises(Stop):
        s.feed(b"before " + P1 + b" after")


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [P1, P2, UNREG, b"surr_", b"s", b"su", b"_", b"A", b"7", b" ", b'"', b"xyz", b"surr"]
        ),
        max_size=40,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_same_output_whatever_the_chunking(parts: list[bytes], cuts: list[int]) -> None:
    body = b"".join(parts)
    assert chunked(body, [c for c in cuts if c <= len(body)]) == whole(body)


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        pytest.param("application/json", "json", id="json"),
        pytest.param("application/vnd.api+json; charset=utf-8", "json", id="plus-json"),
        pytest.param("Application/X-WWW-Form-Urlencoded", "form", id="form"),
        pytest.param("text/plain", "raw", id="text"),
        pytest.param("", "raw", id="none"),
    ],
)
def test_kind(content_type: str, kind: str) -> None:
    assert bodies.kind(content_type) == kind


NASTY = 'a"b\\c/d\n&e=f+g h%ü'


def test_json_escaping_keeps_the_body_valid_json() -> None:
    body = b'{"t": "' + bodies.escape(NASTY, "json") + b'"}'
    assert json.loads(body) == {"t": NASTY}


@pytest.mark.parametrize("how", ["form", "query"])
def test_percent_encoding_keeps_the_field_whole(how: str) -> None:
    body = b"a=1&t=" + bodies.escape(NASTY, how) + b"&b=2"
    assert parse_qs(body.decode(), strict_parsing=True) == {"a": ["1"], "t": [NASTY], "b": ["2"]}


def test_raw_is_the_utf8_value() -> None:
    assert bodies.escape(NASTY, "raw") == NASTY.encode()


def _roundtrip(encoding: str, data: bytes, read: int = 1000) -> bytes:
    enc, dec = bodies.encoder(encoding), bodies.decoder(encoding)
    assert dec is not None
    wire = b"".join(enc(data[i : i + read]) for i in range(0, len(data), read)) + enc(b"")
    return b"".join(b"".join(dec(wire[i : i + read])) for i in range(0, len(wire), read)) + b"".join(dec(b""))


@pytest.mark.parametrize("encoding", ["", "identity", "gzip", "x-gzip", "deflate", "br", "zstd"])
def test_codecs_round_trip_read_by_read(encoding: str) -> None:
    data = bytes(range(256)) * 300 + P1
    assert _roundtrip(encoding, data) == data


def test_gzip_from_the_standard_library_decodes() -> None:
    dec = bodies.decoder("gzip")
    assert dec is not None
    assert b"".join(dec(gzip.compress(b"hello " + P1))) + b"".join(dec(b"")) == b"hello " + P1


def _members(encoding: str) -> bytes:
    """Three concatenated streams of ``encoding``, P1 in the second."""

    def make(data: bytes) -> bytes:
        if encoding in ("gzip", "x-gzip"):
            return gzip.compress(data)
        if encoding == "deflate":
            return zlib.compress(data)
        if encoding == "br":
            return brotli.compress(data)  # type: ignore[no-any-return]
        enc = bodies.encoder(encoding)  # one whole stream (frame) per call
        return enc(data) + enc(b"")

    return make(b"first ") + make(b"second " + P1) + make(b" third")


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip", "zstd"])
@pytest.mark.parametrize("read", [1, 3, 64, 100_000])
def test_every_member_of_a_multi_member_body_is_decoded(encoding: str, read: int) -> None:
    """r2 review: only the first gzip member was decoded, so a placeholder in the second went
    unchecked while the upstream's decoder (Python's, Go's, Node's) read it (RFC 1952 §2.2)."""
    wire, dec = _members(encoding), bodies.decoder(encoding)
    assert dec is not None
    out = b"".join(b"".join(dec(wire[i : i + read])) for i in range(0, len(wire), read)) + b"".join(dec(b""))
    assert out == b"first second " + P1 + b" third"
    if encoding != "zstd":
        assert out == gzip.decompress(wire)


def test_zero_padding_between_gzip_members_is_skipped_as_pythons_gzip_does() -> None:
    wire = gzip.compress(b"a") + b"\0" * 7 + gzip.compress(P1) + b"\0" * 3
    dec = bodies.decoder("gzip")
    assert dec is not None
    out = b"".join(b"".join(dec(wire[i : i + 5])) for i in range(0, len(wire), 5)) + b"".join(dec(b""))
    assert out == gzip.decompress(wire) == b"a" + P1


@pytest.mark.parametrize(
    ("encoding", "wire"),
    [
        pytest.param("deflate", zlib.compress(b"a") + zlib.compress(P1), id="deflate-two-streams"),
        pytest.param("deflate", zlib.compress(b"a") + P1, id="deflate-trailing-bytes"),
        pytest.param("gzip", gzip.compress(b"a") + P1, id="gzip-trailing-garbage"),
        pytest.param("br", _members("br"), id="br-two-streams"),
    ],
)
def test_bytes_after_the_end_of_a_single_stream_are_bad_encoding(encoding: str, wire: bytes) -> None:
    dec = bodies.decoder(encoding)
    assert dec is not None
    with pytest.raises(bodies.BadEncoding):
        list(dec(wire))
        list(dec(b""))


@pytest.mark.parametrize(
    ("encoding", "bomb"),
    [
        pytest.param("gzip", gzip.compress(b"\0" * 5_000_000), id="gzip"),
        pytest.param("deflate", zlib.compress(b"\0" * 5_000_000), id="deflate"),
        pytest.param("br", brotli.compress(b"\0" * 5_000_000), id="br"),
        pytest.param(
            "zstd", bodies.encoder("zstd")(b"\0" * 5_000_000) + bodies.encoder("zstd")(b""), id="zstd"
        ),
    ],
)
def test_decoding_past_the_bound_raises(encoding: str, bomb: bytes) -> None:
    dec = bodies.decoder(encoding, limit=1_000_000)
    assert dec is not None
    with pytest.raises(bodies.TooLarge):
        for _ in dec(bomb):
            pass


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_corrupt_input_is_bad_encoding(encoding: str) -> None:
    dec = bodies.decoder(encoding)
    assert dec is not None
    with pytest.raises(bodies.BadEncoding):
        list(dec(b"\x1f\x8b\x08garbage-that-is-not-compressed" * 10))
        list(dec(b""))


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_a_small_read_that_inflates_hugely_comes_out_in_bounded_pieces(encoding: str) -> None:
    enc, dec = bodies.encoder(encoding), bodies.decoder(encoding)
    assert dec is not None
    wire = enc(b"\0" * 20_000_000) + enc(b"")
    assert len(wire) < 64 * 1024  # one read
    pieces = list(dec(wire))
    assert sum(map(len, pieces)) == 20_000_000
    assert max(map(len, pieces)) <= 1024 * 1024  # 256 KiB asked; brotli may return up to about 2x


def test_unknown_encoding_has_no_decoder() -> None:
    assert bodies.decoder("compress") is None


MAY_HAVE_BODY = [
    pytest.param("HTTP/1.1", "POST", "10", False, True, id="h1-length"),
    pytest.param("HTTP/1.1", "POST", "0", False, False, id="h1-zero-length"),
    pytest.param("HTTP/1.1", "POST", None, True, True, id="h1-chunked"),
    pytest.param("HTTP/1.1", "POST", None, False, False, id="h1-no-framing-no-body"),
    pytest.param("HTTP/1.1", "GET", None, False, False, id="h1-get"),
    pytest.param("HTTP/2.0", "POST", None, False, True, id="h2-post-unknown-length"),
    pytest.param("HTTP/2.0", "PUT", "5", False, True, id="h2-length"),
    pytest.param("HTTP/2.0", "GET", None, False, False, id="h2-get"),
    pytest.param("HTTP/2.0", "delete", None, False, False, id="h2-delete"),
    pytest.param("HTTP/2.0", "GET", "3", False, True, id="h2-get-with-length"),
]


@pytest.mark.parametrize(("version", "method", "length", "chunked", "expected"), MAY_HAVE_BODY)
def test_may_have_body(version: str, method: str, length: str | None, chunked: bool, expected: bool) -> None:
    assert bodies.may_have_body(version, method, length, chunked) is expected
