"""Credential value sources of rules files: where a real secret comes from.

A value source is written ``env:NAME`` (read once, at load) or ``file:PATH`` (a relative PATH is
taken from the rules file's folder; the file is re-read whenever its size, mtime or inode
changes, so rotating a token is ``mv new-token PATH``). One trailing newline is dropped. A
literal value is refused on purpose: secrets do not belong in rules files.

Every value read passes :func:`proxy.core.secrets.checked_value`. Raises
:class:`proxy.core.errors.SecretUnavailable` naming the source, never the value.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from proxy.core.errors import SecretUnavailable
from proxy.core.secrets import Secret, checked_value

__all__ = ["Secret", "ValueSource", "checked_value"]


@dataclass(slots=True)
class ValueSource:
    """A parsed ``env:``/``file:`` spec. :meth:`current` gives ``(Secret, version)``.

    ``version`` starts at 1 and grows by one each time the value read differs from the last.
    """

    spec: str
    kind: str
    ref: str
    _secret: Secret | None = field(default=None, repr=False)
    _stamp: tuple[int, int, int] | None = field(default=None, repr=False)
    version: int = 0
    _previous: list[tuple[Secret, float]] = field(default_factory=list, repr=False)

    @classmethod
    def parse(cls, spec: str, base_dir: Path) -> ValueSource:
        """Parse ``spec``; raises ValueError with what would be right when it is not a source."""
        kind, sep, ref = spec.partition(":")
        if not sep or kind not in ("env", "file") or not ref:
            raise ValueError(
                "must be 'env:NAME' or 'file:PATH' (literal secret values are refused in rules files)"
            )
        if kind == "file":
            ref = str((base_dir / os.path.expanduser(ref)).resolve())
        return cls(spec=spec, kind=kind, ref=ref)

    def describe(self) -> str:
        return f"{self.kind}:{self.ref}"

    def current(self) -> tuple[Secret, int]:
        """Return the current value and its version, re-reading a changed file."""
        if self.kind == "env":
            if self._secret is None:
                raw = os.environ.get(self.ref)
                if raw is None:
                    raise SecretUnavailable(f"environment variable {self.ref} is not set")
                self._bump(checked_value(raw, self.describe()))
            assert self._secret is not None
            return self._secret, self.version
        try:
            st = os.stat(self.ref)
        except OSError as e:
            raise SecretUnavailable(f"cannot read {self.describe()}: {e.strerror}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp or self._secret is None:
            try:
                raw = Path(self.ref).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
                raise SecretUnavailable(f"cannot read {self.describe()}: {reason}") from None
            self._bump(checked_value(raw, self.describe()))
            self._stamp = stamp
        assert self._secret is not None
        return self._secret, self.version

    def previous(self, since: float) -> list[Secret]:
        """Values this source read before the current one, superseded at or after ``since``
        (unix seconds), newest first; at most 8 are kept (see :mod:`proxy.store.live`)."""
        return [s for s, at in reversed(self._previous) if at >= since]

    def _bump(self, value: str) -> None:
        if self._secret is None or self._secret.reveal() != value:
            if self._secret is not None:
                self._previous = [*self._previous[-7:], (self._secret, time.time())]
            self._secret = Secret(value)
            self.version += 1
