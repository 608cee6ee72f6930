"""Placeholders in the request target, for substitution (:mod:`proxy.core.substitute`): in the
path (never a surface: never swappable) and in the query, where one spelled raw or
percent-encoded once is swapped for the secret percent-encoded as a query component needs
(RFC 3986 §3.4: every byte but the unreserved ones, so ``&``, ``=``, ``+`` and ``#`` cannot
change the query's shape). The target is scanned as sent and percent-decoded, so ``%5F`` cannot
hide ``_``.

Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote_to_bytes

from proxy.core import bodies, placeholders, spellings
from proxy.core.outcome import Hit
from proxy.core.policy import Credential, Surface


def registered(value: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[Credential]:
    """Registered credentials whose placeholder is in ``value`` as sent or percent-decoded."""
    found = placeholders.find(value)
    if b"%" in value:
        found += placeholders.find(unquote_to_bytes(value))
    out: list[Credential] = []
    for m in found:
        cred = by_placeholder.get(m.group())
        if cred is not None and cred not in out:
            out.append(cred)
    return out


def spelled(ph: bytes) -> re.Pattern[bytes]:
    """``ph`` with each byte raw or percent-encoded (either hex case), as a query may hold it."""
    parts = []
    for b in ph:
        hx = f"{b:02X}".encode()
        alts = {hx, hx.lower(), hx[:1] + hx[1:].lower(), hx[:1].lower() + hx[1:]}
        parts.append(b"(?:" + re.escape(bytes([b])) + b"|%(?:" + b"|".join(sorted(alts)) + b"))")
    return re.compile(b"".join(parts) + rb"(?![A-Za-z0-9])")


def target_hits(path: bytes, query: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[Hit]:
    """Registered placeholders in the request target: in the path (never swappable) and in the
    query (swappable when spelled raw or percent-encoded once; any other spelling is not)."""
    hits = [
        Hit(Surface.PATH, by_placeholder[ph], swappable=False)
        for ph in spellings.hidden(path, by_placeholder)
    ]
    found = registered(query, by_placeholder)
    hits += [Hit(Surface.QUERY, c) for c in found]
    for ph in spellings.hidden(query, by_placeholder):
        if by_placeholder[ph] not in found:
            hits.append(Hit(Surface.QUERY, by_placeholder[ph], swappable=False))
    return hits


def swap_query(query: bytes, placeholder: bytes, secret: str) -> bytes:
    """``query`` with each spelling of ``placeholder`` (raw or percent-encoded) replaced by
    ``secret`` percent-encoded as a query component."""
    escaped = bodies.escape(secret, "query")
    return spelled(placeholder).sub(lambda _: escaped, query)
