"""The violation scan's reader: placeholders hidden in other spellings of a value.

Pure (no I/O). :func:`hidden` finds the placeholders of ``registered`` inside ``value`` spelled

- raw, also when followed by more letters or digits (``surr_…xyz``: a receiver can cut the tail);
- percent-encoded, any byte, either hex case (RFC 3986 §2.1), up to :data:`MAX_LAYERS` layers
  (``%5F``, ``%255F``);
- base64 or base64url (RFC 4648 §4, §5), with or without padding, alone or at any alignment inside
  a longer run (``Basic base64(user:P)``, a JWT segment, ``xyz`` + base64(…)), and with whitespace
  inside the run (a header folded by hand);
- any nesting of these up to :data:`MAX_LAYERS` decodings (base64 of a percent-encoded value, …).

It serves refusals and the audit, never substitution: a placeholder spelled any way but raw is
not swapped (the credential's ``on_misplaced`` decides toward a bound host), and toward a host its
credential is not bound to it is a violation. Placeholders are not secrets, so this is about
showing the attempt; the secret itself never leaves toward an unbound host in any spelling.

Not read: hex, base32, quoted-printable, HTML entities, JSON ``\\u`` escapes in headers,
compression, encryption: the list of encodings is open-ended, and an attacker who controls the
receiving host gains nothing from a placeholder (it is only worth something through this proxy).

Cost: one regex pass per value for runs of 28 base64 characters or more (the shortest encoding of
the shortest placeholder, 21 bytes) and a ``%`` search; a value with neither costs two C-level scans.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Container
from urllib.parse import unquote_to_bytes

from proxy import placeholders

MAX_LAYERS = 3
_PREFIX = placeholders.PREFIX.encode("ascii")
_MIN_BODY, _MAX_BODY = 16, 64  # placeholders.PATTERN: 16..64 letters or digits after the prefix
_ALNUM = re.compile(rb"[A-Za-z0-9]*")
_MIN_RUN = -(-(len(_PREFIX) + _MIN_BODY) * 4 // 3)  # 28: base64 characters of 21 bytes
_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}" % _MIN_RUN)
_WS = re.compile(rb"\s+")
_URLSAFE = bytes.maketrans(b"-_", b"+/")


def hidden(value: bytes, registered: Container[bytes]) -> list[bytes]:
    """The placeholders of ``registered`` found in ``value`` in any spelling above, each once,
    in the order found. Raises nothing."""
    out: list[bytes] = []
    _scan(value, registered, MAX_LAYERS, out)
    if _WS.search(value):
        _runs(_WS.sub(b"", value), registered, MAX_LAYERS, out)
    return out


def _scan(value: bytes, registered: Container[bytes], layers: int, out: list[bytes]) -> None:
    _raw(value, registered, out)
    if layers == 0:
        return
    if b"%" in value:
        decoded = unquote_to_bytes(value)
        if decoded != value:
            _scan(decoded, registered, layers - 1, out)
    _runs(value, registered, layers, out)


def _runs(value: bytes, registered: Container[bytes], layers: int, out: list[bytes]) -> None:
    """Decode every long base64/base64url run of ``value`` at each of its 4 character offsets:
    one of them is the alignment the run was encoded at, whatever preceded it."""
    for m in _RUN.finditer(value):
        run = m.group().translate(_URLSAFE)
        for k in range(4):
            part = run[k:]
            rem = len(part) % 4
            part = part[:-1] if rem == 1 else part + b"=" * ((4 - rem) % 4)
            try:
                decoded = base64.b64decode(part)
            except (binascii.Error, ValueError):  # pragma: no cover - every character is valid
                continue
            _scan(decoded, registered, layers - 1, out)


def _raw(value: bytes, registered: Container[bytes], out: list[bytes]) -> None:
    """Registered placeholders at each ``surr_`` of ``value``, also with letters or digits after."""
    at = value.find(_PREFIX)
    while at != -1:
        start = at + len(_PREFIX)
        body = _ALNUM.match(value, start)
        n = body.end() - start if body else 0
        for length in range(_MIN_BODY, min(n, _MAX_BODY) + 1):
            candidate = value[at : start + length]
            if candidate in registered and candidate not in out:
                out.append(candidate)
                break
        at = value.find(_PREFIX, start)
