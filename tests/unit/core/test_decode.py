"""Bounded streaming decoding of compressed bodies: right output whatever the reads, and bombs
or corrupt data refused before they are held in memory."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib
from collections.abc import Callable

import brotli  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import decode
from proxy.core.decode import Unscannable, decoder

TEXT = b"".join(b'line %d: data: {"token": "abc"}\n' % i for i in range(5000))


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate-raw": _raw_deflate,
    "br": brotli.compress,
    "zstd": decode.zstd.compress,
    "identity": lambda b: b,
}


def _encoding(name: str) -> str:
    return "deflate" if name == "deflate-raw" else name


def _run(encoding: str, body: bytes, size: int) -> bytes:
    d = decoder(encoding)
    assert d is not None
    return b"".join(d(body[i : i + size]) for i in range(0, len(body), size)) + d(b"")


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.parametrize("size", [1, 7, 65536], ids=["1B", "7B", "64KiB"])
def test_decodes_whatever_the_reads(name: str, size: int) -> None:
    assert _run(_encoding(name), ENCODERS[name](TEXT), size) == TEXT


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", gzip.compress(b"one ") + gzip.compress(b"two")),
        ("zstd", decode.zstd.compress(b"one ") + decode.zstd.compress(b"two")),
    ],
    ids=["gzip-members", "zstd-frames"],
)
def test_concatenated_members_are_all_decoded(encoding: str, body: bytes) -> None:
    assert _run(encoding, body, 5) == b"one two"


@pytest.mark.parametrize("encoding", ["compress", "gzip, br", "snappy"])
def test_no_decoder_for_other_codings(encoding: str) -> None:
    assert decoder(encoding) is None


@pytest.mark.parametrize("name", ["gzip", "deflate", "br", "zstd"])
def test_data_that_is_not_in_the_coding_is_unscannable(name: str) -> None:
    with pytest.raises(Unscannable, match="corrupt"):
        _run(name, b"\xff" * 64 + ENCODERS[name](TEXT), 4096)


@pytest.mark.parametrize("name", ["gzip", "deflate"])
def test_a_damaged_body_is_unscannable(name: str) -> None:
    """These codings carry a checksum (brotli and zstd by default do not: a damaged body decodes to other
    bytes, which are scanned like any others)."""
    body = bytearray(ENCODERS[name](TEXT))
    body[len(body) // 2 : len(body) // 2 + 16] = b"\xff" * 16
    with pytest.raises(Unscannable, match="corrupt"):
        _run(name, bytes(body), 4096)


BOMB = b"\0" * (200 << 20)  # 200 MiB of zeros: ~200 KiB gzip, a few KiB br/zstd


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {
        "gzip": gzip.compress(BOMB, compresslevel=9),
        "br": brotli.compress(BOMB, quality=5),
        "zstd": decode.zstd.compress(BOMB),
    }


@pytest.mark.parametrize("name", ["gzip", "br", "zstd"])
def test_a_bomb_is_stopped_at_the_bound_in_one_read(name: str, bombs: dict[str, bytes]) -> None:
    """The whole bomb in one read: the per-read bound stops it after READ_LIMIT bytes."""
    d = decoder(name)
    assert d is not None
    tracemalloc.start()
    try:
        with pytest.raises(Unscannable, match="one read decodes to more than"):
            d(bombs[name])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < decode.READ_LIMIT + 4 * decode.STEP


@pytest.mark.parametrize("name", ["gzip", "br", "zstd"])
def test_a_bomb_fed_in_small_reads_is_stopped_by_the_ratio(name: str, bombs: dict[str, bytes]) -> None:
    with pytest.raises(Unscannable, match="more than"):
        _run(name, bombs[name], 1024)


def test_a_highly_compressible_small_body_passes_under_the_floor() -> None:
    body = b"a" * (8 << 20)
    assert _run("gzip", gzip.compress(body), 65536) == body


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=3000), st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=20))
def test_any_reads_of_any_body_decode_to_it(body: bytes, sizes: list[int]) -> None:
    for name in ("gzip", "deflate-raw", "br", "zstd"):
        enc = ENCODERS[name](body)
        d = decoder(_encoding(name))
        assert d is not None
        out, pos, i = [], 0, 0
        while pos < len(enc):
            n = sizes[i % len(sizes)]
            out.append(d(enc[pos : pos + n]))
            pos, i = pos + n, i + 1
        out.append(d(b""))
        assert b"".join(out) == body, name
