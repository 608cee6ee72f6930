"""Forged placeholders: strings that carry a valid surrogate checksum but are not registered for
the claim that sends them.

Such a string was issued by surrogate to *someone* (another claim, or a credential since
deleted) or was forged to look like it; none of these can be served, so the request is refused
(``403 forged_placeholder``, action ``violation``) and audited with the places it was found in
(``forged``), never with the string itself. Why refuse rather than pass it inert: a valid
checksum by chance is a 1-in-62**6 event, so the request is a probe across claims or a stale
credential; a clear refusal tells an honest agent its placeholder is gone, and no upstream ever
sees another claim's placeholder. Both cases get the same answer, so the refusal tells a probing
sandbox nothing about which placeholders exist elsewhere.

Scanned: every header value, Basic credentials decoded (RFC 7617 §2), and the request target as
sent and percent-decoded: the same places substitution and violations look at; and, as the
violation scan does, header names and every spelling :mod:`proxy.core.spellings` reads (percent,
base64/base64url at any alignment, nested) in names, values and the target. A string is forged
only when it is exactly a checksummed placeholder: a longer run of letters or digits is another
string.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Container, Sequence
from urllib.parse import unquote_to_bytes

from proxy.core import placeholders, spellings

_WS = re.compile(rb"\s+")
MAX_PLACES = 8  # places named in the audit event: bounded whatever the request holds


def _basic(value: bytes) -> bytes | None:
    parts = value.strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    token = _WS.sub(b"", parts[1])
    try:
        return base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def _forged_in(value: bytes, registered: Container[bytes]) -> bool:
    for m in placeholders.find(value):
        found = m.group()
        if found not in registered and placeholders.has_valid_checksum(found.decode("ascii")):
            return True
    for found in spellings.candidates(value):  # other spellings; each is "surr_" + its whole run
        if found not in registered and placeholders.has_valid_checksum(found.decode("ascii")):
            return True
    return False


def find_forged(
    fields: Sequence[tuple[bytes, bytes]], target: bytes, registered: Container[bytes]
) -> list[str]:
    """Where a forged placeholder appears: ``["header X-Api-Key", "a header name", "request
    target"]`` (at most
    ``MAX_PLACES``, header names as sent), or ``[]``. ``registered`` holds the requesting claim's
    placeholders as bytes."""
    places: list[str] = []
    for name, value in fields:
        decoded = _basic(value) if name.lower() == b"authorization" else None
        if _forged_in(name, registered):
            places.append("a header name")  # never the name: it holds the string
        elif _forged_in(value, registered) or (decoded and _forged_in(decoded, registered)):
            places.append(f"header {name[:64].decode('latin-1')}")
    decoded_target = unquote_to_bytes(target) if b"%" in target else target
    if _forged_in(target, registered) or _forged_in(decoded_target, registered):
        places.append("request target")
    return places[:MAX_PLACES]
