"""Request-head hygiene: refuse heads that parsers disagree on, drop hop-by-hop headers.

Pure over the header fields as received (``(name, value)`` byte pairs). Refused (400 unless
said otherwise): more than one Host header (RFC 9112 §3.2), a value holding a control character
other than HTAB (RFC 9110 §5.5; this includes a bare CR or LF that would fold or split a line),
a head over ``MAX_HEAD_BYTES`` or ``MAX_HEADERS`` fields (431, RFC 6585 §5), and TRACE toward a
host one of the claim's credentials is bound to (it would echo the swapped secret back).

Dropped before forwarding (RFC 9110 §7.6.1): every header ``Connection`` names, ``Keep-Alive``
and ``Proxy-Connection``. Kept: ``Connection`` itself and its ``close``/``keep-alive``/``upgrade``
tokens (mitmproxy reads them from the same request to manage the client's connection), and
``TE`` (``te: trailers`` is required by gRPC over HTTP/2). ``Proxy-*`` headers are dropped by
identify.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 200
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HOP_BY_HOP = frozenset({b"keep-alive", b"proxy-connection"})
_KEEP = frozenset({b"close", b"keep-alive", b"upgrade", b"te", b"host", b"connection"})


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 0: fine
    message: str = ""
    drop: frozenset[bytes] = frozenset()  # lower-cased header names to remove


def check_head(fields: Sequence[tuple[bytes, bytes]], method: str, credentialed_host: bool) -> Verdict:
    """Judge a request head; ``credentialed_host``: a credential of the claim is bound to it."""
    if len(fields) > MAX_HEADERS:
        return Verdict(431, f"more than {MAX_HEADERS} header fields")
    if sum(len(n) + len(v) + 4 for n, v in fields) > MAX_HEAD_BYTES:
        return Verdict(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
    names = [n.lower() for n, _ in fields]
    if names.count(b"host") > 1:
        return Verdict(400, "more than one Host header")
    if _CONTROL.search(b"".join(n + v for n, v in fields)):  # then find the header to name
        for name, value in fields:
            if _CONTROL.search(value) or _CONTROL.search(name):
                return Verdict(400, f"control character in header {name[:64].decode('latin-1')!r}")
    if method == "TRACE" and credentialed_host:
        return Verdict(405, "TRACE toward a host with credentials is refused (it would echo them)")
    drop = set(_HOP_BY_HOP)
    for name, value in fields:
        if name.lower() == b"connection":
            drop.update(t.strip().lower() for t in value.split(b",") if t.strip().lower() not in _KEEP)
    return Verdict(0, drop=frozenset(d for d in drop if d in names))
