"""Placeholders in header fields, for substitution (:mod:`proxy.core.substitute`): raw in a value
(swappable in the credential's header slots), inside Basic credentials (swappable in its Basic
parts, :mod:`proxy.core.basicauth`), and in any other spelling of a value or of a name (never
swappable; :mod:`proxy.core.spellings`).

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxy.core import placeholders, spellings
from proxy.core.basicauth import decode_basic
from proxy.core.outcome import Hit
from proxy.core.policy import Credential, Surface
from proxy.core.slots import BasicPart, split_basic

_URLSAFE = bytes.maketrans(b"-_", b"+/")


def header_hits(i: int, name: bytes, value: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[Hit]:
    """Every registered placeholder in header field ``i``: raw in the value (swappable in the
    credential's header slots), in Basic credentials (swappable in its Basic parts), and in any
    other spelling of the value or of the name (never swappable; see :mod:`proxy.core.spellings`)."""
    found = spellings.hidden(value, by_placeholder)  # the raw spellings too: none, no hit
    named = spellings.hidden(name, by_placeholder)
    head = value.lstrip()[:6]
    basic = head[:5].lower() == b"basic" and head[5:6].isspace()
    if not (found or named or basic):
        return []  # the common case, kept cheap: most fields hold no placeholder at all
    where = f"header {name.decode('latin-1')}"
    hits: list[Hit] = []
    for m in placeholders.find(value):
        cred = by_placeholder.get(m.group())
        if cred is not None:
            hits.append(Hit(Surface.HEADER, cred, i, cred.swaps_in_header(name), where))
    decoded = decode_basic(value) if basic and name.lower() == b"authorization" else None
    if decoded:
        user, password = split_basic(decoded)
        for part, text in ((BasicPart.USER, user), (BasicPart.PASSWORD, password or b"")):
            for m in placeholders.find(text):
                cred = by_placeholder.get(m.group())
                if cred is not None:
                    in_part = f"the Basic {'user name' if part is BasicPart.USER else 'password'} of {where}"
                    hits.append(Hit(Surface.BASIC, cred, i, cred.swaps_in_basic(part), in_part, part))
    seen = {h.credential.name for h in hits}
    # Basic credentials (also base64url ones, in any header) are decoded and read again, so that
    # their own base64 is not one of the layers the scan reads
    again = decoded or (decode_basic(value.translate(_URLSAFE)) if basic else None)
    for ph in found + (spellings.hidden(again, by_placeholder) if again else []):
        cred = by_placeholder[ph]
        if cred.name not in seen:
            seen.add(cred.name)
            surface = Surface.BASIC if basic else Surface.HEADER
            hits.append(Hit(surface, cred, i, False, f"{where}, encoded"))
    hits += [Hit(Surface.HEADER, by_placeholder[ph], i, False, "a header name") for ph in named]
    return hits
