"""``surrogate audit verify FILE...``: check the audit hash chain (:mod:`proxy.core.chain`).

The files are read in chain order whatever order they are given in: rotated backups oldest
first (``PATH.5`` … ``PATH.1``, as RotatingFileHandler names them), then ``PATH``; files
without such a suffix by name. So ``surrogate audit verify audit.jsonl*`` works.

Exit status: 0 the chain is intact, 1 it is broken (the first line that was changed, removed,
reordered, inserted or truncated is printed, with file, line number and the hash expected
there), 2 usage (no such file, not readable).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from proxy import audit
from proxy.core import chain

INTACT, BROKEN, USAGE = 0, 1, 2
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<n>[0-9]+)$")


def add_parser(audit_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verify = audit_sub.add_parser(
        "verify",
        help="check the audit files' hash chain: report the first line changed, removed or reordered",
        description="Exit status: 0 intact, 1 broken (the first broken line is printed), 2 usage.",
    )
    verify.add_argument(
        "files", nargs="+", type=Path, metavar="FILE", help="audit files, with their rotated PATH.N backups"
    )


def chain_order(files: list[Path]) -> list[Path]:
    """``files`` oldest first: ``PATH.N`` (highest N first) before ``PATH``, else by name."""

    def key(p: Path) -> tuple[str, int]:
        m = _ROTATED.match(str(p))
        return (m["base"], -int(m["n"])) if m else (str(p), 0)

    return sorted(dict.fromkeys(files), key=key)


def read_lines(path: Path) -> list[chain.Line]:
    """Every line of ``path``; the last is incomplete when the file does not end with a newline."""
    data = path.read_bytes()
    pieces = data.split(b"\n")
    lines = [chain.Line(str(path), n, raw) for n, raw in enumerate(pieces[:-1], 1)]
    if pieces[-1]:
        lines.append(chain.Line(str(path), len(pieces), pieces[-1], complete=False))
    return lines


def main_verify(args: argparse.Namespace) -> int:
    lines: list[chain.Line] = []
    files = chain_order(args.files)
    for path in files:
        try:
            lines += read_lines(path)
        except OSError as e:
            print(f"surrogate: cannot read {path}: {e.strerror or e}", file=sys.stderr)
            return USAGE
    report = chain.verify(lines, audit.PREV)
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
    last = f"; last line {lines[-1].file}:{lines[-1].number}, sha256 {report.head}" if report.head else ""
    print(f"intact: {report.lines} lines in {len(files)} file(s){last}")
    return INTACT
