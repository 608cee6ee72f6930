"""addons/malformed.py's strict chunked reader on h11's own buffer: RFC 9112 §7.1 chunk-size lines
pass, whatever the chunking; anything else raises before h11 reads it (issue 20)."""

from __future__ import annotations

import h11
import pytest
from h11._receivebuffer import ReceiveBuffer

from addons.malformed import MAX_CHUNK_LINE, Malformed, StrictChunkedReader


def _read(data: bytes, step: int) -> bytes:
    """The body ``StrictChunkedReader`` reads from ``data`` fed ``step`` bytes at a time."""
    reader, buf, body, pos = StrictChunkedReader(), ReceiveBuffer(), b"", 0
    while True:
        event = reader(buf)
        if isinstance(event, h11.EndOfMessage):
            return body
        if isinstance(event, h11.Data):
            body += bytes(event.data)
            continue
        assert pos < len(data), "the body never ended"
        buf += data[pos : pos + step]
        pos += step


GOOD = b'5\r\nhello\r\n1;a=b\r\n \r\n000003;q="x\\"y";z\r\nabc\r\n0\r\n\r\n'


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, len(GOOD)])
def test_well_formed_chunks_read_the_same_whatever_the_chunking(step: int) -> None:
    assert _read(GOOD, step) == b"hello abc"


def test_many_small_chunks_in_one_read() -> None:
    data = b"1\r\nx\r\n" * 20_000 + b"0\r\n\r\n"
    assert _read(data, len(data)) == b"x" * 20_000


@pytest.mark.parametrize(
    "line",
    [
        b"ffffffffffffffff1\r\n",
        b"8000000000000000\r\n",
        b"00000000000000001\r\n",
        b"5 \r\n",
        b" 5\r\n",
        b"5;\r\n",
        b"5;a=\r\n",
        b"5\n",
        b"5\rx\r\n",
        b"g\r\n",
        b"5;a=\xff\r\n",
    ],
)
@pytest.mark.parametrize("step", [1, 1000])
def test_a_malformed_line_raises_after_good_chunks_too(line: bytes, step: int) -> None:
    with pytest.raises(Malformed):
        _read(b"5\r\nhello\r\n" + line + b"hello\r\n0\r\n\r\n", step)


def test_a_line_without_an_end_raises_at_the_bound() -> None:
    reader, buf = StrictChunkedReader(), ReceiveBuffer()
    buf += b"0" * (MAX_CHUNK_LINE - 1)
    assert reader(buf) is None  # not complete yet
    buf += b"0"
    with pytest.raises(Malformed):
        reader(buf)


def test_a_trailer_section_past_its_bound_raises() -> None:
    from addons.malformed import MAX_TRAILERS

    reader, buf = StrictChunkedReader(), ReceiveBuffer()
    buf += b"0\r\nX-T: " + b"a" * MAX_TRAILERS
    with pytest.raises(Malformed):
        reader(buf)

