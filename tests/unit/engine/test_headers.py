"""proxy.engine.headers: the faster Headers lookups answer exactly as mitmproxy's do."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http

from proxy.engine import headers

FIELDS: list[tuple[tuple[bytes, bytes], ...]] = [
    (),
    ((b"Host", b"a.test"),),
    ((b"Accept", b"text/html"), (b"accept", b"application/xml"), (b"ACCEPT", b"*/*")),
    ((b"Content-Length", b"0"), (b"Transfer-Encoding", b"chunked"), (b"content-length", b"5")),
    ((b"X-Caf\xc3\xa9", b"cr\xc3\xa8me"), (b"x-caf\xc3\xa9", b"\xff\xfe")),  # UTF-8 and not
    ((b"X-\xff", b"v"), (b"x-\xff", b"w")),  # a surrogate-escaped name
    ((b"", b"empty name"), (b"Set-Cookie", b"a=1"), (b"set-cookie", b"b=2")),
]
KEYS: list[Any] = [
    "host", "HOST", b"host", "accept", b"Accept", "content-length", b"transfer-encoding",
    "x-café", "X-CAFÉ", b"x-caf\xc3\xa9", "x-\udcff", b"x-\xff", "", b"", "set-cookie", "absent",
    b"absent", "hos", "hostx", None, 1, 1.5, ("host",), bytearray(b"host"),
]  # fmt: skip


def _answer(f: Callable[[], Any]) -> Any:
    try:
        return ("value", f())
    except Exception as e:  # the same exception type is part of "the same answer"
        return ("raises", type(e))


def _answers(h: http.Headers, key: Any) -> list[Any]:
    return [
        _answer(lambda: h.get_all(key)),
        _answer(lambda: h.get(key)),
        _answer(lambda: h.get(key, "dflt")),
        _answer(lambda: key in h),
        _answer(lambda: h[key]),
    ]


def _stock(monkeypatch: pytest.MonkeyPatch) -> None:
    """mitmproxy's own lookups, restored after the test (other tests get Headers as before)."""
    monkeypatch.setattr(http.Headers, "get_all", headers.STOCK_GET_ALL)
    monkeypatch.setattr(http.Headers, "get", Mapping.get)
    monkeypatch.setattr(http.Headers, "__contains__", Mapping.__contains__)
    monkeypatch.delattr(http.Headers, headers._MARK, raising=False)


def _compare(
    sets: list[tuple[tuple[bytes, bytes], ...]], keys: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _stock(monkeypatch)
    hs = [http.Headers(list(f)) for f in sets]
    before = [_answers(h, k) for h in hs for k in keys]
    headers.install()
    headers.install()  # idempotent
    assert http.Headers.get_all is not headers.STOCK_GET_ALL
    after = [_answers(h, k) for h in hs for k in keys]
    assert after == before


def test_every_lookup_answers_as_mitmproxys(monkeypatch: pytest.MonkeyPatch) -> None:
    _compare(FIELDS, KEYS, monkeypatch)


def test_a_field_name_that_is_not_bytes_answers_as_mitmproxys(monkeypatch: pytest.MonkeyPatch) -> None:
    h = http.Headers([(b"Host", b"a.test")])
    h.fields = (("Host", b"str name"), (b"host", "str value"), (b"host", b"v"))  # type: ignore[assignment]
    _stock(monkeypatch)
    before = [_answers(h, k) for k in KEYS]
    headers.install()
    assert [_answers(h, k) for k in KEYS] == before


_names = st.sampled_from([b"Host", b"host", b"HoSt", b"Content-Length", b"x-\xff", b"X-\xc3\xa9", b""])
_fields = st.lists(st.tuples(_names | st.binary(max_size=6), st.binary(max_size=6)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(fields=_fields, key=_names | st.binary(max_size=6) | st.text(max_size=6))
def test_random_header_sets_answer_as_mitmproxys(fields: list[tuple[bytes, bytes]], key: Any) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _compare([tuple(fields)], [key, key.upper() if isinstance(key, (str, bytes)) else key], mp)
