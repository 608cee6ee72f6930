"""Placeholders: the recognisable strings a sandbox holds instead of real secrets.

Format: ``surr_`` followed by 16 to 64 ASCII letters or digits, not followed by another letter
or digit (e.g. ``surr_4fQ9xT2LmB7pR1sK8vN3wY6zA0cE5hJd``). Because every placeholder has this
shape, finding them is one regex pass over a value, whose cost does not depend on how many
placeholders are registered: each hit is then one dict lookup.

A string of this shape that is not registered for the claim is left alone (it is not a secret).

**Checksum.** Placeholders that surrogate generates end in ``CHECKSUM_LENGTH`` (6) characters that
are a checksum of the rest: base62 of BLAKE2b-64 over ``surr_`` + the random part, reduced
modulo 62**6. No secret is involved: it tells a string that surrogate issued (to some claim,
at some time) from one that merely has the shape, with a chance of 1 in 62**6 (≈ 5.7e10) for a
random string. Compatibility: a registered placeholder is honoured whether or not it carries a
checksum (rules files hold hand-written ones such as ``surr_DemoGithubPlaceholder0001``); only
the *forgery* check needs the checksum: a string with a valid checksum that is not registered
for the requesting claim (another claim's, a deleted one, a forged one) is refused as
``forged_placeholder`` (see :mod:`proxy.core.forgery`). A string without a valid checksum that is
not registered stays inert, as before.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string

PREFIX = "surr_"
_BODY = f"[{string.ascii_letters}{string.digits}]"
PATTERN = re.compile(f"{PREFIX}{_BODY}{{16,64}}(?![A-Za-z0-9])")
PATTERN_BYTES = re.compile(PATTERN.pattern.encode("ascii"))
_PREFIX_BYTES = PREFIX.encode("ascii")
_ALPHABET = string.ascii_letters + string.digits


def is_placeholder(text: str) -> bool:
    """True when ``text`` is exactly one placeholder of the recognisable format."""
    return PATTERN.fullmatch(text) is not None


CHECKSUM_LENGTH = 6
_CHECKSUM_SPACE = len(_ALPHABET) ** CHECKSUM_LENGTH


def checksum(stem: str) -> str:
    """The ``CHECKSUM_LENGTH`` base62 characters that end a generated placeholder whose other
    characters are ``stem`` (prefix included)."""
    digest = hashlib.blake2b(stem.encode("ascii"), digest_size=8).digest()
    n = int.from_bytes(digest, "big") % _CHECKSUM_SPACE
    out = []
    for _ in range(CHECKSUM_LENGTH):
        n, d = divmod(n, len(_ALPHABET))
        out.append(_ALPHABET[d])
    return "".join(reversed(out))


def has_valid_checksum(text: str) -> bool:
    """True when ``text`` is exactly one placeholder whose last 6 characters are the checksum of
    the rest, i.e. one surrogate generated (or a lucky 1-in-62**6 string)."""
    if not is_placeholder(text):
        return False
    stem, tail = text[:-CHECKSUM_LENGTH], text[-CHECKSUM_LENGTH:]
    return checksum(stem) == tail


def generate(length: int = 32) -> str:
    """A fresh random placeholder (``length`` characters after the prefix, 16..64), whose last 6
    characters are its checksum. Raises ValueError for another length."""
    if not 16 <= length <= 64:
        raise ValueError("placeholder length must be 16..64")
    stem = PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(length - CHECKSUM_LENGTH))
    return stem + checksum(stem)


def find(value: bytes) -> list[re.Match[bytes]]:
    """All placeholder-shaped runs in ``value``, left to right (cheap when there are none)."""
    if _PREFIX_BYTES not in value:
        return []
    return list(PATTERN_BYTES.finditer(value))
