"""``surrogate audit verify FILE...``: check the audit hash chain (:mod:`proxy.core.chain`).

The files are read in chain order whatever order they are given in: rotated backups oldest
first (``PATH.5`` … ``PATH.1``, as RotatingFileHandler names them), then ``PATH``; files
without such a suffix by name. So ``surrogate audit verify audit.jsonl*`` works.

Exit status: 0 the chain is intact, 1 it is broken (the first line that was changed, removed,
reordered, inserted or truncated is printed, with file, line number and the hash expected
there) or no line carries ``prev`` at all (nothing was verified), 2 usage (no such file, not
readable).

The files are streamed: read once line by line when intact, once more to diagnose a break,
memory flat whatever their size (a pipe, ``… | surrogate audit verify /dev/stdin``, is
spooled to a temporary file as it is read, since it cannot be read twice). A line longer than
:data:`LONGEST` (any line the writer writes is shorter) is broken, and never held whole.
``--restarts``: the files are a captured stdout (``kubectl logs``), where each start of the
proxy begins a fresh chain; without it a fresh chain after the first line is a break
(:func:`proxy.core.chain.verify`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proxy.core import chain

INTACT, BROKEN, USAGE = 0, 1, 2
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>[0-9]+)$")
LONGEST = 16 * 1024 * 1024  # longer than any audit line (the writer's and the relay's limit)
_CHUNK = 1024 * 1024


def add_parser(audit_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = audit_sub.add_parser(
        "verify",
        help="check the audit files' hash chain: report the first line changed, removed or reordered",
        description="Exit status: 0 intact, 1 broken (the first broken line is printed), 2 usage.",
    )
    verify.add_argument(
        "--restarts",
        action="store_true",
        help="the files are a captured stdout (kubectl logs), where each start of the proxy begins "
        "a fresh chain (prev null); without it a fresh chain after the first line is a break",
    )
    verify.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="audit files, with their rotated PATH.N backups"
    )


def chain_order(files: list[Path]) -> list[Path]:
    """``files`` oldest first: ``PATH.N`` (highest N first) before ``PATH``, else by name; each
    file once, however it is named."""

    def key(p: Path) -> tuple[str, int]:
        m = _ROTATED.match(str(p))
        return (m["base"], -int(m["n"])) if m else (str(p), 0)

    unique: dict[Path, Path] = {}
    for p in files:  # one file named twice (``./a``, ``a``, a symlink) is read once
        try:
            same = p.resolve()
        except OSError:
            same = p
        unique.setdefault(same, p)
    return sorted(unique.values(), key=key)


def read_lines(path: Path) -> list[chain.Line]:
    """Every line of ``path`` (a list: for small files and tests; :func:`iter_lines` streams)."""
    return list(iter_lines(path))


def iter_lines(path: Path, name: str | None = None) -> Iterator[chain.Line]:
    """The lines of ``path`` (named ``name`` in reports), one at a time; the last is incomplete
    when the file does not end with a newline; a line longer than :data:`LONGEST` is given
    ``too_long`` with only its start."""
    shown = str(path) if name is None else name
    with path.open("rb") as f:
        number = 0
        while True:
            raw = f.readline(LONGEST + 1)
            if not raw:
                return
            number += 1
            if raw.endswith(b"\n"):
                yield chain.Line(shown, number, raw[:-1])
            elif len(raw) <= LONGEST:
                yield chain.Line(shown, number, raw, complete=False)
            else:
                complete = _skip_line(f)
                yield chain.Line(shown, number, raw[:64], complete=complete, too_long=True)


def _skip_line(f: Any) -> bool:
    """Read past the rest of an over-long line, a chunk at a time: whether its newline came."""
    while True:
        chunk = f.readline(_CHUNK)
        if not chunk:
            return False
        if chunk.endswith(b"\n"):
            return True


class _Files:
    """The files' lines in chain order, read afresh each time they are iterated (the chain is
    read once more to diagnose a break). A file that cannot be read twice (a pipe:
    ``… | surrogate audit verify /dev/stdin``) is copied, a chunk at a time, to a temporary file
    in ``spool`` first. An OSError while reading is raised to the caller."""

    def __init__(self, files: list[Path], spool: Path) -> None:
        self.files: list[tuple[Path, str]] = []
        for n, path in enumerate(files):
            if path.is_file():
                self.files.append((path, str(path)))
                continue
            copy = spool / str(n)
            with path.open("rb") as src, copy.open("wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
            self.files.append((copy, str(path)))

    def __iter__(self) -> Iterator[chain.Line]:
        for path, name in self.files:
            yield from iter_lines(path, name)


def main_verify(args: argparse.Namespace) -> int:
    from proxy import audit  # structlog: only to verify, not to build the parser

    files = chain_order(args.files)
    for path in files:
        try:
            with path.open("rb"):
                pass
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory")
        except OSError as e:
            print(f"surrogate: cannot read {path}: {e.strerror or e}", file=sys.stderr)
            return USAGE
    try:
        with tempfile.TemporaryDirectory(prefix="surrogate-verify-") as spool:
            report = chain.verify(_Files(files, Path(spool)), audit.PREV, restarts=args.restarts)
    except OSError as e:
        print(f"surrogate: cannot read {e.filename}: {e.strerror or e}", file=sys.stderr)
        return USAGE
    if report.unchained:
        print(f"{report.unchained} line(s) before the first chained line (older): not covered")
    for file, number, follows in report.starts:
        if follows is None:
            print(f"{file}:{number}: a new chain starts (its writer started with nothing to follow)")
        else:
            print(f"{file}:{number}: continues from a line not given (sha256 {follows}): older files?")
    b = report.broken
    if b is not None:
        print(f"{b.file}:{b.number}: broken: {b.kind}: {b.message}")
        if b.expected or b.found:
            print(f"  expected: {b.expected}\n  found:    {b.found}")
        return BROKEN
    if report.head is None and report.unchained:
        print(f"no chained line: none of the {report.lines} line(s) carries {audit.PREV!r}: nothing verified")
        return BROKEN
    last = f"; sha256 of the last line {report.head}" if report.head else ""
    print(f"intact: {report.lines} lines in {len(files)} file(s){last}")
    return INTACT
