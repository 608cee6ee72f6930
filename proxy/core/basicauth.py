"""Basic credentials (RFC 7617 §2) for substitution: ``Authorization: Basic base64(user:pass)``
decoded leniently, as servers read it, and rebuilt with a placeholder swapped in one part only.
git and curl send the Basic credentials they build from ``https://user:P@host`` URLs this way.

Pure; no I/O.
"""

from __future__ import annotations

import base64
import binascii
import re

from proxy.core import slots
from proxy.core.slots import BasicPart

_WS = re.compile(rb"\s+")


def decode_basic(value: bytes) -> bytes | None:
    """The decoded credentials of a Basic ``value``, read leniently (any whitespace after the
    scheme, inside or around the token; missing padding) as servers do, so an odd spelling
    cannot carry a placeholder past the check."""
    parts = value.strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    token = _WS.sub(b"", parts[1])
    try:
        return base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def replace(text: bytes, ph: bytes, real: bytes) -> bytes:
    """``text`` with each occurrence of ``ph`` that is a placeholder (not followed by a letter or
    digit: ``placeholders.PATTERN``) replaced by ``real``; a longer run is another string."""
    return re.sub(re.escape(ph) + rb"(?![A-Za-z0-9])", lambda _: real, text)


def swap_basic(
    field_: tuple[bytes, bytes], swaps: list[tuple[BasicPart | None, bytes, bytes]]
) -> tuple[bytes, bytes]:
    """``field_`` (Basic credentials) with each ``(part, placeholder, secret)`` swapped in its part
    only, re-encoded (RFC 7617 §2) under the scheme spelling the client used."""
    name, value = field_
    decoded = decode_basic(value)
    if decoded is None:
        return field_
    user, password = slots.split_basic(decoded)
    for part, ph, real in swaps:
        if part is BasicPart.USER:
            user = replace(user, ph, real)
        elif password is not None:
            password = replace(password, ph, real)
    rebuilt = user if password is None else user + b":" + password
    scheme = value.strip().split(None, 1)[0]
    return name, scheme + b" " + base64.b64encode(rebuilt)
