"""A secret value that hides itself, and the check every value passes before use.

Every value, wherever it is read (a rules file's ``env:``/``file:`` source in
:mod:`proxy.rules.sources`, the encrypted store, a token endpoint's response), must be non-empty
and free of control characters (CR, LF, NUL, ...): it is placed into HTTP header values, where
those would split or smuggle headers (RFC 9110 §5.5). One trailing newline is dropped.

Raises :class:`proxy.core.errors.SecretUnavailable` naming the source, never the value.
"""

from __future__ import annotations

import re

from proxy.core.errors import SecretUnavailable

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Secret:
    """A secret value. ``repr``/``str`` never show it; only :meth:`reveal` does."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not picklable")


def checked_value(value: str, source: str) -> str:
    """``value`` without one trailing newline; raises SecretUnavailable when empty or holding a
    control character. ``source`` names where it came from (never the value)."""
    if value.endswith("\n"):
        value = value[:-1]
        if value.endswith("\r"):
            value = value[:-1]
    if not value:
        raise SecretUnavailable(f"credential value from {source} is empty")
    if _CONTROL.search(value):
        raise SecretUnavailable(
            f"credential value from {source} contains a control character (CR, LF, NUL, ...); "
            "it would corrupt the HTTP header it is placed in"
        )
    return value
