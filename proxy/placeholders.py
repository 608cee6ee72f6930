"""Placeholders: the recognisable strings a sandbox holds instead of real secrets.

Format: ``surr_`` followed by 16 to 64 ASCII letters or digits, not followed by another letter
or digit (e.g. ``surr_4fQ9xT2LmB7pR1sK8vN3wY6zA0cE5hJd``). Because every placeholder has this
shape, finding them is one regex pass over a value, whose cost does not depend on how many
placeholders are registered: each hit is then one dict lookup.

A string of this shape that is not registered for the claim is left alone (it is not a secret).
"""

from __future__ import annotations

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


def generate(length: int = 32) -> str:
    """A fresh random placeholder (``length`` characters after the prefix, 16..64)."""
    if not 16 <= length <= 64:
        raise ValueError("placeholder length must be 16..64")
    return PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def find(value: bytes) -> list[re.Match[bytes]]:
    """All placeholder-shaped runs in ``value``, left to right (cheap when there are none)."""
    if _PREFIX_BYTES not in value:
        return []
    return list(PATTERN_BYTES.finditer(value))
