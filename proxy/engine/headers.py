"""Faster lookups on mitmproxy's ``Headers``, with the same results (issue 19).

A request through surrogate looks a header up about 35 times (mitmproxy's HTTP/1 layer asks
``expected_http_body_size`` ten times, its writer and our addons the rest). mitmproxy 12.3's
``Headers.get_all`` goes ``_always_bytes`` → ``MultiDict.get_all``, which calls the Python
static method ``Headers._kconv`` (``key.lower()``) once per field per lookup, and ``get`` /
``in`` come from ``collections.abc.Mapping``: ``self[key]``, raising and catching ``KeyError``
for every absent header. Measured on the bench (bench/cprof.py at c=16) these lookups were 5.4%
of the proxy's CPU, ``_kconv`` alone 1.8% (175 calls per request).

:func:`install` replaces ``get_all``, ``get`` and ``__contains__`` on ``Headers`` with versions
that lower-case each field name with ``bytes.lower`` directly and answer an absent name without an
exception. Results and errors are mitmproxy's, which ``tests/unit/engine/test_headers.py``
checks against the stock methods over a table of names and header sets (repeated and mixed-case
names, non-ASCII and surrogate-escaped bytes, str and bytes keys, wrong key types): the same
values in the same order, ``", "``-folding as ``Headers._reduce_values``, and the same exception
type for a key that is neither str nor bytes. Idempotent.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import http

_MARK = "_surrogate_fast_headers"
_always_bytes = http._always_bytes
_native = http._native
STOCK_GET_ALL = http.Headers.get_all  # mitmproxy's, for the equivalence tests (install() is ours)


def install() -> None:
    """Put the faster lookups on ``mitmproxy.http.Headers`` (module docstring). Idempotent."""
    if getattr(http.Headers, _MARK, False):
        return
    http.Headers.get_all = _get_all  # type: ignore[method-assign]
    http.Headers.get = _get  # type: ignore[method-assign,assignment]
    http.Headers.__contains__ = _contains  # type: ignore[method-assign,assignment]
    setattr(http.Headers, _MARK, True)


def _key(name: Any) -> Any:
    # mitmproxy: _always_bytes(name) (str: UTF-8 with surrogateescape), then Headers._kconv
    # (.lower()); anything else goes through always_bytes for the same errors (TypeError; None
    # passes it and fails on .lower())
    t = type(name)
    if t is str:
        return name.encode("utf-8", "surrogateescape").lower()
    return name.lower() if t is bytes else _always_bytes(name).lower()


def _get_all(self: http.Headers, name: Any) -> list[str]:
    key = _key(name)
    return [_native(v) for k, v in self.fields if k.lower() == key]


def _get(self: http.Headers, key: str | bytes, default: Any = None) -> Any:
    values = _get_all(self, key)
    return ", ".join(values) if values else default  # Headers._reduce_values


def _contains(self: http.Headers, key: object) -> bool:
    return bool(_get_all(self, key))  # decodes what matches, as mitmproxy's self[key] does
