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
cannot reach to cover those. A captured stdout (``verify(..., restarts=True)``) has one more:
each start of its writer is a fresh chain, so lines put just before a restart's first line, or
two runs swapped, are not seen either (a file's writer never starts a fresh chain after its
first line: without ``restarts`` that is a break, and so are lines without ``prev`` before a
first chained line that does not follow them).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
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
    too_long: bool = False  # longer than any line the writer writes; ``raw`` holds its start


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
    if line.too_long:
        raise _Unreadable("unreadable", "longer than any audit line (changed, or inserted)")
    if not line.complete:
        raise _Unreadable("truncated", "the file ends inside this line (truncated, or its writer died)")
    try:
        obj = json.loads(line.raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise _Unreadable("unreadable", "not a JSON line (changed, or inserted)") from None
    if not isinstance(obj, dict) or key not in obj:
        raise _Unreadable("unreadable", f"not a chained audit line (no {key!r}): changed, or inserted")
    prev = obj[key]
    if prev is not None and not (isinstance(prev, str) and _HEX.fullmatch(prev)):
        raise _Unreadable("changed", f"{key!r} is not a SHA-256 hex digest or null")
    return _Parsed(line, line_hash(line.raw), prev, obj.get("worker"), obj.get("seq"))


def verify(lines: Iterable[Line], key: str, *, restarts: bool = False) -> Report:
    """Check the chain over ``lines`` (every file's lines, oldest file first). Lines before the
    first that carries ``key`` (written before the chain existed) are skipped; the first chained
    line must then follow the last of them (the sink continues an upgraded file from it).

    Streaming: an intact chain is read once, line by line, keeping one line; a break is
    diagnosed by reading ``lines`` once more (pass what can be iterated again: a list, or an
    object whose ``__iter__`` reopens the files), with memory that does not grow with them.

    ``restarts``: the lines are a captured stdout (``kubectl logs``, journald), where each start
    of the writer begins a fresh chain (``prev: null``). Without it, a fresh chain after the first
    line is a break: a file's writer continues from the file's last line (rotation, restart), so
    a null there was put there, with whatever was put before it. With it, whatever is put just
    before a restart's first line, or whole runs swapped, cannot be told (see the module doc)."""
    count, unchained = 0, 0
    starts: list[tuple[str, int, str | None]] = []
    older: str | None = None  # the hash of the last line from before the chain
    before: _Parsed | None = None  # the chained line before this one
    first: _Parsed | None = None
    fresh: set[str] = set()  # restarts: the first line of each fresh chain (a replay repeats one)
    index = -1
    for line in lines:
        count += 1
        try:
            p = _parse(line, key)
        except _Unreadable as e:
            if before is None and e.kind == "unreadable" and line.complete and not line.too_long:
                unchained += 1  # older lines, from before the chain
                older = line_hash(line.raw)
                continue
            return Report(count, starts, None, Break(line.file, line.number, e.kind, e.message), unchained)
        index += 1
        if before is None:
            first = p
            if unchained and p.prev != older:
                message = (
                    "does not follow the line before it: the first chained line of an upgraded file follows "
                    "its last older line, so the lines before it were put there or changed"
                )
                return Report(count, starts, None, _at(p, "changed", message, older, p.prev), unchained)
            if not unchained:
                starts.append((p.line.file, p.line.number, p.prev))
        elif p.prev == before.digest:
            pass
        elif p.prev is None and restarts and p.digest not in fresh:
            starts.append((p.line.file, p.line.number, None))
        else:
            assert first is not None
            total, broken = _diagnose(lines, key, index, first, before, p)
            return Report(total, starts, None, broken, unchained)
        if p.prev is None:
            fresh.add(p.digest)
        before = p
    return Report(count, starts, before.digest if before else None, None, unchained)


def _at(p: _Parsed, kind: str, message: str, expected: str | None, found: str | None) -> Break:
    return Break(p.line.file, p.line.number, kind, message, expected, found)


def _name(line: Line) -> str:
    return f"{line.file}:{line.number}"


_MAX_WORKERS = 4096  # the seq numbering of more workers than this is not read (a hostile file)


@dataclass
class _Seen:
    """What the second reading gathers about chained line ``i`` (``p``), which broke the chain."""

    total: int = 0
    copy_of: Line | None = None  # the first line before ``i`` with p's bytes
    earlier: int | None = None  # the last line before ``i - 1`` that ``p`` names as its prev
    earlier_line: Line | None = None
    after_earlier: Line | None = None  # the line after that one
    later: Line | None = None  # the first line after ``i`` that ``p`` names as its prev
    first_follows: Line | None = None  # a line after the first that the first names as its prev
    next_prev: str | None = None
    has_next: bool = False
    last_seq: dict[Any, int] = field(default_factory=dict)
    seen: set[Any] = field(default_factory=set)
    missing: int = 0


def _diagnose(
    lines: Iterable[Line], key: str, i: int, first: _Parsed, before: _Parsed, p: _Parsed
) -> tuple[int, Break]:
    """Why chained line ``i`` (``p``) does not follow ``before`` (see the module doc): read
    ``lines`` again, keeping only what tells the kind of edit. Returns (lines read, the break)."""
    s = _Seen()
    index, chained, stopped = -1, False, False
    for line in lines:
        s.total += 1
        if stopped:
            continue
        try:
            q = _parse(line, key)
        except _Unreadable:
            stopped = chained  # (older lines before the chain are skipped, as in verify)
            continue
        chained = True
        index += 1
        _gather(s, index, i, first, p, q)
    if s.first_follows is not None:
        message = f"out of order: it follows {_name(s.first_follows)}, which comes after it (moved or copied)"
        return s.total, _at(first, "reordered", message, None, first.prev)
    if s.copy_of is not None:
        return s.total, _at(p, "inserted", f"a copy of {_name(s.copy_of)} (inserted)", None, p.digest)
    expected = before.digest
    if s.later is not None:
        message = f"out of order: it follows {_name(s.later)}, which comes after it (moved or copied)"
        return s.total, _at(p, "reordered", message, expected, p.prev)
    if p.prev is None:
        message = (
            "a fresh chain (prev null) inside the chain: a file's writer continues from the file's last "
            "line, so this line, or the lines before it, were put here (a captured stdout: --restarts)"
        )
        return s.total, _at(p, "inserted", message, expected, None)
    if s.earlier_line is not None and s.after_earlier is not None:
        follows = f"{_name(p.line)} follows {_name(s.earlier_line)}"
        message = f"not in the chain: {follows}: the lines between were inserted"
        return s.total, Break(s.after_earlier.file, s.after_earlier.number, "inserted", message)
    if s.has_next and s.next_prev != p.digest:
        message = "changed: its prev names no line, and the next line does not follow it"
        return s.total, _at(p, "changed", message, expected, p.prev)
    if s.missing:
        message = f"{s.missing} line(s) removed before it (its prev names no line; a worker's seq skips)"
        return s.total, _at(p, "removed", message, expected, p.prev)
    message = f"changed (or a line right after it removed): {_name(p.line)} names a different hash for it"
    return s.total, _at(before, "changed", message, p.prev, before.digest)


def _gather(s: _Seen, index: int, i: int, first: _Parsed, p: _Parsed, q: _Parsed) -> None:
    """Fold chained line ``index`` (``q``) into what :func:`_diagnose` knows."""
    if index > 0 and s.first_follows is None and first.prev is not None and q.digest == first.prev:
        s.first_follows = q.line
    worker = q.worker if isinstance(q.worker, (int, str)) else None
    counted = isinstance(q.seq, int) and not isinstance(q.seq, bool)
    if index < i:
        if s.copy_of is None and q.digest == p.digest:
            s.copy_of = q.line
        if s.earlier is not None and index == s.earlier + 1:
            s.after_earlier = q.line
        if index < i - 1 and q.digest == p.prev:
            s.earlier, s.earlier_line, s.after_earlier = index, q.line, None
        if counted and (worker in s.last_seq or len(s.last_seq) < _MAX_WORKERS):
            s.last_seq[worker] = q.seq
        return
    if index > i and s.later is None and q.digest == p.prev:
        s.later = q.line
    if index == i + 1:
        s.has_next, s.next_prev = True, q.prev
    if counted and worker not in s.seen and len(s.seen) < _MAX_WORKERS:
        s.seen.add(worker)
        last = s.last_seq.get(worker)
        if last is not None and q.seq > last + 1:
            s.missing += q.seq - last - 1
