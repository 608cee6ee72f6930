"""The audit hash chain: every audit line names the SHA-256 of the line written before it.

Pure: lines (bytes) in, a verdict out; no file is opened here (``surrogate audit verify``,
:mod:`proxy.cli.verify`, reads them; :mod:`proxy.audit` writes them).

What a line carries, and why:

- ``prev``: the lower-case hex SHA-256 of the exact bytes of the previous line of the same
  writer, without its ``\\n``. The writer is the one process that writes the audit file or
  stream: ``surrogate run`` itself, or with ``--workers N`` its supervisor, which writes every
  worker's lines (so one chain covers all workers, and a line removed from any of them is
  found; ``worker`` and ``seq`` still say which worker made the event).
- The first line of a chain names what it follows: ``null`` for a fresh chain (an empty file,
  or stdout), else the hash of the line it continues from: after a rotation, the last line of
  the rotated file; after a restart on the same file, that file's last line.

What :func:`verify` reports is the first line that breaks the chain, with what was expected
(the hash of the line before it) and what was found, and the kind of edit that explains it:
changed, removed, reordered, inserted, truncated. The kind is read from the chain and from the
``(worker, seq)`` numbering: a chain alone cannot tell "line 5 was changed" from "a line after
line 5 was removed"; a gap in a worker's ``seq`` can.

What a hash chain without a key cannot show (see docs/threat-model.md): lines removed from the
end of the newest file, lines added after its last line, the oldest lines of the oldest file
given (they look like rotated away), and an edit by someone who rewrites every following line's
``prev``. Keep the last hash (``head``, printed by verify) somewhere the writer of the file
cannot reach to cover those.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_HEX = re.compile(r"[0-9a-f]{64}")


def line_hash(line: bytes) -> str:
    """The chain's hash of one line: hex SHA-256 of its bytes (without the newline)."""
    return hashlib.sha256(line).hexdigest()


def splice(line: str, key: str, prev: str | None) -> str | None:
    """``line`` (one rendered JSON object) with ``key: prev`` added as its last member, without
    parsing or serialising it again; None when ``line`` is not a non-empty JSON object's text."""
    if len(line) < 3 or line[0] != "{" or line[-1] != "}":
        return None
    value = "null" if prev is None else f'"{prev}"'
    # json.dumps's separators, as one process renders ``prev`` itself: the same line whatever --workers
    return f'{line[:-1]}, "{key}": {value}}}'


@dataclass(frozen=True)
class Line:
    """One line as read: where it is, its bytes without the newline, and whether the newline
    was there (a file that ends inside a line was truncated, or its writer died mid-line)."""

    file: str
    number: int
    raw: bytes
    complete: bool = True


@dataclass(frozen=True)
class Break:
    """The first line that breaks the chain. ``kind``: changed | removed | reordered |
    inserted | truncated | unreadable. ``expected`` / ``found``: the hash the chain expected
    there and the one it found (a ``prev``, or the line's own hash), where one applies."""

    file: str
    number: int
    kind: str
    message: str
    expected: str | None = None
    found: str | None = None


@dataclass(frozen=True)
class Report:
    """``lines`` read; ``starts``: where a chain starts and what it follows (None: a fresh
    chain; a hash: a line not among those given); ``head``: the last line's hash;
    ``broken``: the first break, None when intact; ``unchained``: lines before the first one
    that carries ``prev`` (written before the chain existed), not covered by it."""

    lines: int
    starts: list[tuple[str, int, str | None]] = field(default_factory=list)
    head: str | None = None
    broken: Break | None = None
    unchained: int = 0


@dataclass(frozen=True)
class _Parsed:
    line: Line
    digest: str
    prev: str | None
    worker: Any
    seq: Any


class _Unreadable(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _parse(line: Line, key: str) -> _Parsed:
    if not line.complete:
        raise _Unreadable("truncated", "the file ends inside this line (truncated, or its writer died)")
    try:
        obj = json.loads(line.raw)
    except ValueError:
        raise _Unreadable("unreadable", "not a JSON line (changed, or inserted)") from None
    if not isinstance(obj, dict) or key not in obj:
        raise _Unreadable("unreadable", f"not a chained audit line (no {key!r}): changed, or inserted")
    prev = obj[key]
    if prev is not None and not (isinstance(prev, str) and _HEX.fullmatch(prev)):
        raise _Unreadable("changed", f"{key!r} is not a SHA-256 hex digest or null")
    return _Parsed(line, line_hash(line.raw), prev, obj.get("worker"), obj.get("seq"))


def verify(lines: Sequence[Line], key: str) -> Report:
    """Check the chain over ``lines`` (every file's lines, oldest file first). Lines before the
    first that carries ``key`` (written before the chain existed) are skipped."""
    parsed: list[_Parsed] = []
    starts: list[tuple[str, int, str | None]] = []
    unchained = 0
    older: str | None = None  # the hash of the last line from before the chain
    for line in lines:
        try:
            parsed.append(_parse(line, key))
        except _Unreadable as e:
            if not parsed and e.kind == "unreadable" and line.complete:
                unchained += 1  # older lines, from before the chain
                older = line_hash(line.raw)
                continue
            broken = Break(line.file, line.number, e.kind, e.message)
            return Report(len(lines), starts, None, broken, unchained)
    where: dict[str, list[int]] = {}
    for i, p in enumerate(parsed):
        where.setdefault(p.digest, []).append(i)
    for i, p in enumerate(parsed):
        first = where[p.digest][0]
        if first < i:  # no two written lines are alike (time, seq and prev differ)
            copy = _at(p, "inserted", f"a copy of {_name(parsed[first])} (inserted)", None, p.digest)
            return Report(len(lines), starts, None, copy, unchained)
        if p.prev is not None and p.prev == (parsed[i - 1].digest if i else older):
            continue  # (the first chained line of an upgraded file follows its last older line)
        later = [j for j in where.get(p.prev or "", []) if j > i]
        if later:
            return Report(len(lines), starts, None, _reordered(parsed, i, later[0]), unchained)
        if p.prev is None or i == 0:
            starts.append((p.line.file, p.line.number, p.prev))
            continue
        return Report(len(lines), starts, None, _diagnose(parsed, i, where), unchained)
    head = parsed[-1].digest if parsed else None
    return Report(len(lines), starts, head, None, unchained)


def _at(p: _Parsed, kind: str, message: str, expected: str | None, found: str | None) -> Break:
    return Break(p.line.file, p.line.number, kind, message, expected, found)


def _name(p: _Parsed) -> str:
    return f"{p.line.file}:{p.line.number}"


def _reordered(parsed: list[_Parsed], i: int, j: int) -> Break:
    p = parsed[i]
    expected = parsed[i - 1].digest if i else None
    message = f"out of order: it follows {_name(parsed[j])}, which comes after it (moved or copied)"
    return _at(p, "reordered", message, expected, p.prev)


def _diagnose(parsed: list[_Parsed], i: int, where: dict[str, list[int]]) -> Break:
    """Why line ``i`` does not follow line ``i - 1`` (see the module doc)."""
    p, before = parsed[i], parsed[i - 1]
    expected = before.digest
    earlier = [j for j in where.get(p.prev or "", []) if j < i - 1]
    if earlier:
        j = earlier[-1]
        first = parsed[j + 1]
        message = f"not in the chain: {_name(p)} follows {_name(parsed[j])}: the lines between were inserted"
        return _at(first, "inserted", message, None, None)
    confirmed = i + 1 >= len(parsed) or parsed[i + 1].prev == p.digest
    if not confirmed:
        message = "changed: its prev names no line, and the next line does not follow it"
        return _at(p, "changed", message, expected, p.prev)
    gap = _seq_gap(parsed, i)
    if gap:
        message = f"{gap} line(s) removed before it (its prev names no line; a worker's seq skips)"
        return _at(p, "removed", message, expected, p.prev)
    message = f"changed (or a line right after it removed): {_name(p)} names a different hash for it"
    return _at(before, "changed", message, p.prev, before.digest)


def _seq_gap(parsed: list[_Parsed], i: int) -> int:
    """Lines missing between ``i - 1`` and ``i`` by the ``(worker, seq)`` numbering: for each
    worker, its last seq before ``i`` and its first seq from ``i`` on (0 when none skips)."""
    last: dict[Any, int] = {}
    for p in parsed[:i]:
        if isinstance(p.seq, int):
            last[p.worker] = p.seq
    missing = 0
    seen: set[Any] = set()
    for p in parsed[i:]:
        if p.worker in seen or not isinstance(p.seq, int):
            continue
        seen.add(p.worker)
        if p.worker in last and p.seq > last[p.worker] + 1:
            missing += p.seq - last[p.worker] - 1
    return missing
