"""proxy.core.chain: an intact chain over several workers and rotated files verifies, and each
kind of edit (change, delete, reorder, insert, truncate) is found at the line it was made.

Lines are made as the audit sink makes them (``splice`` of ``prev`` into a rendered JSON
object, ``line_hash`` of its bytes); edits work on the files' lines, and the expected finding
is given as (file index, line number, kind) of the edited files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import chain

KEY = "prev"
Files = list[list[bytes]]


def make(n: int, workers: int = 2, per_file: int = 4, run: int = 0) -> Files:
    """``n`` chained lines from ``workers`` interleaved workers, in files of ``per_file`` lines."""
    prev: str | None = None
    seqs = [0] * workers
    flat: list[bytes] = []
    for i in range(n):
        w = i % workers
        seqs[w] += 1
        fields = {"event": "request", "host": f"h{i}.test", "worker": 100 + w + run, "seq": seqs[w]}
        rendered = json.dumps(fields)
        line = chain.splice(rendered, KEY, prev)
        assert line is not None
        raw = line.encode()
        prev = chain.line_hash(raw)
        flat.append(raw)
    return [flat[k : k + per_file] for k in range(0, n, per_file)]


def lines_of(files: Files, tail: dict[int, bytes] | None = None) -> list[chain.Line]:
    """The files as verify reads them; ``tail[f]``: an unfinished last line of file ``f``."""
    out = []
    for f, raws in enumerate(files):
        out += [chain.Line(f"f{f}", n, raw) for n, raw in enumerate(raws, 1)]
        if tail and f in tail:
            out.append(chain.Line(f"f{f}", len(raws) + 1, tail[f], complete=False))
    return out


def locate(files: Files, g: int) -> tuple[int, int]:
    """(file index, 0-based line in it) of global line ``g``."""
    for f, raws in enumerate(files):
        if g < len(raws):
            return f, g
        g -= len(raws)
    raise IndexError(g)


def flat(files: Files) -> list[bytes]:
    return [raw for raws in files for raw in raws]


def found(files: Files, tail: dict[int, bytes] | None = None) -> tuple[str, int, str] | None:
    report = chain.verify(lines_of(files, tail), KEY)
    b = report.broken
    return None if b is None else (b.file, b.number, b.kind)


def at(files: Files, g: int, kind: str) -> tuple[str, int, str]:
    f, k = locate(files, g)
    return (f"f{f}", k + 1, kind)


# -- edits: each returns the edited files and where the break must be reported ---------------


@dataclass
class Edited:
    files: Files
    expected: set[tuple[str, int, str]]
    tail: dict[int, bytes] | None = None


def change(files: Files, g: int) -> Edited:
    f, k = locate(files, g)
    files[f][k] = files[f][k].replace(b'"host": "h', b'"host": "x')
    return Edited(files, {at(files, g, "changed")})


def change_prev(files: Files, g: int) -> Edited:
    f, k = locate(files, g)
    obj = json.loads(files[f][k])
    obj[KEY] = "0" * 64
    files[f][k] = json.dumps(obj).encode()
    return Edited(files, {at(files, g, "changed")})


def delete(files: Files, g: int) -> Edited:
    f, k = locate(files, g)
    del files[f][k]
    files = [raws for raws in files if raws]
    return Edited(files, {at(files, g, "removed"), at(files, g - 1, "changed")})


def swap(files: Files, g: int) -> Edited:
    f1, k1 = locate(files, g)
    f2, k2 = locate(files, g + 1)
    files[f1][k1], files[f2][k2] = files[f2][k2], files[f1][k1]
    return Edited(files, {at(files, g, "reordered")})


def insert_forged(files: Files, g: int) -> Edited:
    """A well-formed line with the right ``prev``: found at the next line, reported at it."""
    f, k = locate(files, g)
    before = flat(files)[g - 1]
    forged = chain.splice('{"event": "request", "host": "forged.test"}', KEY, chain.line_hash(before))
    assert forged is not None
    files[f].insert(k, forged.encode())
    return Edited(files, {at(files, g, "inserted")})


def insert_garbage(files: Files, g: int) -> Edited:
    f, k = locate(files, g)
    files[f].insert(k, b"not an audit line")
    return Edited(files, {at(files, g, "unreadable")})


def insert_copy(files: Files, g: int, m: int) -> Edited:
    copy = flat(files)[m]
    f, k = locate(files, g)
    files[f].insert(k, copy)
    kinds = {at(files, g, "inserted"), at(files, g, "reordered")}
    if m == g:  # right before its original: two identical lines, either is "the copy"
        kinds.add(at(files, g + 1, "inserted"))
    return Edited(files, kinds)


def truncate(files: Files, g: int, cut: int) -> Edited:
    """The file holding line ``g`` ends ``cut`` bytes into it (its later lines gone)."""
    f, k = locate(files, g)
    raw = files[f][k]
    cut = 1 + cut % (len(raw) - 1)
    files[f] = files[f][:k]
    return Edited(files, {(f"f{f}", k + 1, "truncated")}, tail={f: raw[:cut]})


def cut_rotated(files: Files, f: int, keep: int) -> Edited:
    """A rotated (older) file loses its last lines, at a line boundary: the next file's first
    line follows a line that is gone."""
    keep = keep % len(files[f])
    files[f] = files[f][:keep]
    files = [raws for raws in files if raws]
    nxt = f + 1 if keep else f
    expected = {(f"f{nxt}", 1, "removed")}
    if nxt:  # no later line of the removed lines' worker shows a seq gap: the line before is named
        expected.add((f"f{nxt - 1}", len(files[nxt - 1]), "changed"))
    return Edited(files, expected)


# -- intact ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,workers,per_file", [(1, 1, 4), (12, 2, 4), (30, 3, 7), (9, 1, 100)])
def test_an_intact_chain_of_workers_and_rotated_files_verifies(n: int, workers: int, per_file: int) -> None:
    files = make(n, workers, per_file)
    report = chain.verify(lines_of(files), KEY)
    assert report.broken is None
    assert report.lines == n
    assert report.starts == [("f0", 1, None)]  # one fresh chain, across every rotation
    assert report.head == chain.line_hash(flat(files)[-1])


def test_a_file_whose_older_files_are_gone_verifies_and_says_what_it_follows() -> None:
    files = make(12)[1:]
    report = chain.verify(lines_of(files), KEY)
    assert report.broken is None
    assert report.starts == [("f0", 1, json.loads(files[0][0])[KEY])]


def test_an_upgraded_file_chains_on_from_its_last_older_line() -> None:
    """The sink continues a file from its last line, also one written before the chain."""
    older = [b'{"event": "request", "seq": 1}', b'{"event": "request", "seq": 2}']
    line = chain.splice('{"event": "request", "seq": 1}', KEY, chain.line_hash(older[-1]))
    assert line is not None
    report = chain.verify(lines_of([[*older, line.encode()]]), KEY)
    assert report.broken is None and report.unchained == 2 and report.starts == []


def test_a_fresh_chain_inside_a_captured_stdout_is_a_restart_not_a_break() -> None:
    """stdout (``restarts``): a writer that restarts has nothing to follow (the line after it
    still must)."""
    a, b = flat(make(4)), flat(make(3, run=10))
    report = chain.verify(lines_of([a + b]), KEY, restarts=True)
    assert report.broken is None
    assert report.starts == [("f0", 1, None), ("f0", 5, None)]


def test_a_fresh_chain_inside_the_files_of_a_file_writer_is_a_break() -> None:
    """Hostile review: a file's writer continues from its last line (rotation, restart), so a
    ``prev: null`` after the first line was never written by it; verify took it for a restart,
    and lines prepended before a fresh chain (or whole runs swapped) verified as intact."""
    a, b = flat(make(4)), flat(make(3, run=10))
    report = chain.verify(lines_of([a + b]), KEY)
    assert report.broken is not None
    assert (report.broken.file, report.broken.number, report.broken.kind) == ("f0", 5, "inserted")
    forged = flat(make(2, run=50))  # a made-up run, prepended to the real one
    b2 = chain.verify(lines_of([forged + a]), KEY).broken
    assert b2 is not None and (b2.number, b2.kind) == (3, "inserted")
    swapped = chain.verify(lines_of([b + a]), KEY).broken
    assert swapped is not None and (swapped.number, swapped.kind) == (4, "inserted")


def test_a_replayed_run_of_a_captured_stdout_is_a_break() -> None:
    """With ``restarts``, a fresh chain is a restart; the same run twice is a copy."""
    a = flat(make(4))
    b = chain.verify(lines_of([a + a]), KEY, restarts=True).broken
    assert b is not None and (b.number, b.kind) == (5, "inserted")


@pytest.mark.parametrize("follows", ["fresh", "not given"])
def test_lines_put_before_the_chain_are_a_break_not_older_lines(follows: str) -> None:
    """Hostile review: lines without ``prev`` before the first chained line were counted as
    "older, not covered" and the file verified. An upgraded file's first chained line follows
    its last older line (the sink continues from it), so one that does not was preceded by
    lines someone put there (or changed)."""
    files = make(8) if follows == "fresh" else make(12)[1:]
    files[0] = [b'{"event": "request", "host": "made-up.test"}', *files[0]]
    b = chain.verify(lines_of(files), KEY).broken
    assert b is not None and (b.file, b.number, b.kind) == ("f0", 2, "changed")


HOSTILE = [
    ("deeply nested JSON", b"[" * 200_000),
    ("deeply nested object", b'{"a":' * 200_000),
    ("invalid UTF-8", b'{"event": "request", "host": "\xff\xfe"}'),
    ("binary", bytes(range(256))),
    ("NUL bytes", b"\0" * 1000),
    ("a number of 100,000 digits", b'{"prev": null, "seq": ' + b"9" * 100_000 + b"}"),
]


@pytest.mark.parametrize("raw", [r for _, r in HOSTILE], ids=[name for name, _ in HOSTILE])
def test_a_hostile_line_is_unreadable_not_a_crash(raw: bytes) -> None:
    files = make(6)
    files[0].insert(2, raw)
    b = chain.verify(lines_of(files), KEY).broken
    assert b is not None and (b.file, b.number, b.kind) == ("f0", 3, "unreadable")


@pytest.mark.parametrize("worker", [[1], {"a": 1}, None, 1.5, True])
def test_a_worker_of_any_json_type_does_not_crash_the_diagnosis(worker: object) -> None:
    """Hostile review: a ``worker`` that is a list or an object (unhashable) made the seq-gap
    diagnosis raise TypeError: a traceback instead of exit 1."""
    prev: str | None = None
    raws: list[bytes] = []
    for i in range(8):
        line = chain.splice(json.dumps({"host": f"h{i}", "worker": worker, "seq": i + 1}), KEY, prev)
        assert line is not None
        raws.append(line.encode())
        prev = chain.line_hash(raws[-1])
    del raws[4]
    b = chain.verify(lines_of([raws]), KEY).broken
    assert b is not None and (b.number, b.kind) in ((5, "removed"), (4, "changed"))


def test_verify_reads_its_lines_once_more_only_to_diagnose_a_break() -> None:
    """Streaming: an intact chain is read once, line by line (a 1 GB file is never held)."""
    files = make(40)
    reads = []

    class Once:
        def __iter__(self):  # type: ignore[no-untyped-def]
            reads.append(1)
            return iter(lines_of(files))

    assert chain.verify(Once(), KEY).broken is None and len(reads) == 1


# -- each kind of edit, found at its line ---------------------------------------------------

EDITS: list[tuple[str, Callable[[Files], Edited]]] = [
    ("change a field", lambda fs: change(fs, 5)),
    ("change the first line", lambda fs: change(fs, 0)),
    ("change the last line of a rotated file", lambda fs: change(fs, 3)),
    ("change prev", lambda fs: change_prev(fs, 6)),
    ("delete a line", lambda fs: delete(fs, 6)),
    ("delete the first line of a later file", lambda fs: delete(fs, 4)),
    ("delete a whole rotated file", lambda fs: Edited([fs[0], fs[2]], {("f1", 1, "removed")})),
    ("swap two lines", lambda fs: swap(fs, 2)),
    ("swap across a rotation", lambda fs: swap(fs, 3)),
    ("swap the first two lines", lambda fs: swap(fs, 0)),
    ("files in the wrong order", lambda fs: Edited([fs[1], fs[0], fs[2]], {("f0", 1, "reordered")})),
    ("insert a forged line with the right prev", lambda fs: insert_forged(fs, 7)),
    ("insert a line that is not JSON", lambda fs: insert_garbage(fs, 2)),
    ("insert a copy of an earlier line", lambda fs: insert_copy(fs, 9, 2)),
    ("insert a copy of a later line", lambda fs: insert_copy(fs, 2, 9)),
    ("truncate the newest file inside a line", lambda fs: truncate(fs, 10, 17)),
    ("truncate a rotated file inside a line", lambda fs: truncate(fs, 5, 30)),
    ("truncate a rotated file at a line end", lambda fs: cut_rotated(fs, 1, 2)),
]


@pytest.mark.parametrize("edit", [e for _, e in EDITS], ids=[name for name, _ in EDITS])
def test_each_edit_is_found_at_its_line(edit: Callable[[Files], Edited]) -> None:
    edited = edit(make(12))
    assert found(edited.files, edited.tail) in edited.expected


def test_a_break_says_what_was_expected_and_what_was_found() -> None:
    files = make(12)
    before = flat(files)[5]
    edited = delete(files, 6)
    b = chain.verify(lines_of(edited.files), KEY).broken
    assert b is not None and (b.file, b.number, b.kind) == ("f1", 3, "removed")
    assert b.expected == chain.line_hash(before)
    assert b.found == json.loads(edited.files[1][2])[KEY] != b.expected


@st.composite
def edits(draw: st.DrawFn) -> Edited:
    n = draw(st.integers(6, 30))
    files = make(n, draw(st.integers(1, 3)), draw(st.integers(2, 8)))
    last = n - 1
    kinds = ["change", "prev", "delete", "swap", "forged", "garbage", "copy", "cut"]
    kind = draw(st.sampled_from(kinds + (["cut rotated"] if len(files) > 1 else [])))
    # Not covered by a chain without a key (module doc): the newest line (nothing follows it),
    # and lines before the oldest one (they look rotated away).
    if kind == "change":
        return change(files, draw(st.integers(0, last - 1)))
    if kind == "prev":
        return change_prev(files, draw(st.integers(1, last - 1)))
    if kind == "delete":
        return delete(files, draw(st.integers(1, last - 1)))
    if kind == "swap":
        return swap(files, draw(st.integers(0, last - 1)))
    if kind == "forged":
        return insert_forged(files, draw(st.integers(1, last)))
    if kind == "garbage":
        return insert_garbage(files, draw(st.integers(1, last)))
    if kind == "copy":
        return insert_copy(files, draw(st.integers(1, last)), draw(st.integers(0, last)))
    if kind == "cut rotated":
        f = draw(st.integers(0, len(files) - 2))
        return cut_rotated(files, f, draw(st.integers(1, len(files[f]) - 1)))  # a rotated file has 2+
    return truncate(files, draw(st.integers(0, last)), draw(st.integers(0, 10_000)))


@settings(max_examples=300, deadline=None)
@given(edits())
def test_any_single_edit_is_found_at_its_line(edited: Edited) -> None:
    assert found(edited.files, edited.tail) in edited.expected


def test_splice_adds_prev_without_reserialising_and_refuses_what_is_not_an_object() -> None:
    assert chain.splice('{"a": 1}', KEY, None) == '{"a": 1, "prev": null}'
    assert chain.splice('{"a": 1}', KEY, "ab") == '{"a": 1, "prev": "ab"}'
    # The line a supervisor splices is the line one process renders (the README's, `"prev": "…"`;
    # a newcomer's `make run`, two workers, printed `,"prev":null` instead)
    for prev in (None, "ab"):
        assert chain.splice(json.dumps({"a": 1}), KEY, prev) == json.dumps({"a": 1, KEY: prev})
    for bad in ("", "{}", "[1]", "not json", '{"a": 1'):
        assert chain.splice(bad, KEY, None) is None
