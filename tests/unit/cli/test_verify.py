"""``surrogate audit verify FILE...``: exit 0 intact, 1 broken (file, line, what was expected),
2 usage; rotated files are read oldest first whatever order the shell gives them in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy import audit
from proxy.cli.main import main
from proxy.cli.verify import chain_order


@pytest.fixture(autouse=True)
def _reset_audit() -> Iterator[None]:
    yield
    audit.configure(None)


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """A chain over audit.jsonl and more than ten rotated backups."""
    audit.configure(tmp_path / "audit.jsonl", max_bytes=600, backups=30)
    for i in range(60):
        audit.emit("request", {audit.REQUEST_ID: f"r{i}", audit.HOST: "api.test"})
    found = sorted(tmp_path.glob("audit.jsonl*"))  # the shell's order: .1, .10, .11, .2, ...
    assert len(found) > 11
    return found


def test_chain_order_puts_the_oldest_backup_first() -> None:
    given = [Path(p) for p in ["a.jsonl", "a.jsonl.1", "a.jsonl.10", "a.jsonl.2", "b.jsonl"]]
    ordered = ["a.jsonl.10", "a.jsonl.2", "a.jsonl.1", "a.jsonl", "b.jsonl"]
    assert [p.name for p in chain_order(given)] == ordered


def test_intact_files_exit_0_and_print_the_last_hash(
    files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "intact: 60 lines" in out and "sha256 " in out


def test_a_changed_line_exits_1_naming_file_line_and_hashes(
    files: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target = chain_order(files)[3]
    lines = target.read_text().splitlines()
    lines[1] = lines[1].replace("api.test", "evil.test")
    target.write_text("\n".join(lines) + "\n")
    assert main(["audit", "verify", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert f"{target}:2: broken: changed" in out
    assert "expected: " in out and "found: " in out


def test_a_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_no_file_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        main(["audit", "verify"])
    assert e.value.code == 2


# -- hostile files (review r-audit) ----------------------------------------------------------


def chained(n: int, start: str | None = None, run: str = "h") -> list[bytes]:
    from proxy.core import chain

    prev, out = start, []
    for i in range(n):
        fields = f'{{"event": "request", "host": "{run}{i}.test", "seq": {i + 1}}}'
        line = chain.splice(fields, "prev", prev)
        assert line is not None
        out.append(line.encode())
        prev = chain.line_hash(out[-1])
    return out


HOSTILE_LINES = [
    ("deeply nested", b"[" * 500_000),
    ("invalid UTF-8", b'{"event": "request", "host": "\xff\xfe\xed"}'),
    ("binary with NULs", bytes(b for b in range(256) if b != 10) * 10),
    ("a lone surrogate escape", b'{"event": "request", "host": "\\udcff", "prev": null}'),
    ("a huge number", b'{"prev": null, "seq": ' + b"9" * 100_000 + b"}"),
    ("a worker that is a list", b'{"worker": [1], "seq": 1, "prev": null}'),
]


@pytest.mark.parametrize("raw", [r for _, r in HOSTILE_LINES], ids=[n for n, _ in HOSTILE_LINES])
def test_a_hostile_line_exits_1_without_a_traceback(
    tmp_path: Path, raw: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    good = chained(6)
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"\n".join([*good[:3], raw, *good[3:]]) + b"\n")
    assert main(["audit", "verify", str(path)]) == 1
    assert f"{path}:4: broken: " in capsys.readouterr().out


def test_a_file_with_no_chained_line_is_not_intact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hostile review: `audit verify /etc/passwd` said "intact" (every line "older")."""
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\nnot an audit line\n")
    assert main(["audit", "verify", str(path)]) == 1
    assert "no chained line" in capsys.readouterr().out


def test_a_captured_stdout_with_restarts_needs_restarts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "proxy.log"
    path.write_bytes(b"\n".join(chained(3) + chained(2, run="second-run")) + b"\n")
    assert main(["audit", "verify", str(path)]) == 1
    assert f"{path}:4: broken: inserted: a fresh chain" in capsys.readouterr().out
    assert main(["audit", "verify", "--restarts", str(path)]) == 0
    assert f"{path}:4: a new chain starts" in capsys.readouterr().out


def test_a_line_longer_than_any_audit_line_is_broken_without_being_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tracemalloc

    from proxy.cli import verify

    monkeypatch.setattr(verify, "LONGEST", 1 << 20)
    good = chained(4)
    path = tmp_path / "audit.jsonl"
    with path.open("wb") as f:
        f.write(b"\n".join(good[:2]) + b"\n")
        for _ in range(40):  # one 40 MiB line
            f.write(b"A" * (1 << 20))
        f.write(b"\n" + b"\n".join(good[2:]) + b"\n")
    tracemalloc.start()
    try:
        assert main(["audit", "verify", str(path)]) == 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"{path}:3: broken: unreadable: longer than any audit line" in capsys.readouterr().out
    assert peak < 8 << 20, peak


@pytest.mark.parametrize("broken", [False, True])
def test_verify_streams_a_large_file(
    tmp_path: Path, broken: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory stays flat as the file grows (a 1 GB audit file must not be read whole)."""
    import tracemalloc

    path = tmp_path / "audit.jsonl"
    lines = chained(120_000)  # ~9 MB
    if broken:
        del lines[60_000]
    path.write_bytes(b"\n".join(lines) + b"\n")
    del lines
    tracemalloc.start()
    try:
        assert main(["audit", "verify", str(path)]) == (1 if broken else 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak


def test_one_file_named_twice_is_read_once(files: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``verify audit.jsonl* ../logs/audit.jsonl``: the same lines twice read as a copy (a false
    break)."""
    newest = chain_order(files)[-1]
    again = newest.parent / ".." / newest.parent.name / newest.name
    link = newest.parent / "current.jsonl"
    link.symlink_to(newest)
    assert main(["audit", "verify", *map(str, files), str(again), str(link)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("broken", [False, True])
def test_a_pipe_is_verified_like_a_file(tmp_path: Path, broken: bool) -> None:
    """``kubectl logs … | surrogate audit verify --restarts /dev/stdin``: a pipe cannot be read a
    second time (the diagnosis of a break reads the lines again), so it is spooled to a
    temporary file as it is read (flat memory), and the break named at its line."""
    import subprocess
    import sys

    from harness import ROOT

    lines = chained(50)
    if broken:
        del lines[20]
    data = b"\n".join(lines) + b"\n"
    cmd = [sys.executable, "-m", "proxy", "audit", "verify", "/dev/stdin"]
    done = subprocess.run(cmd, cwd=ROOT, input=data, capture_output=True, timeout=60, check=False)
    out = done.stdout.decode()
    if broken:
        assert done.returncode == 1, out + done.stderr.decode()
        assert "/dev/stdin:21: broken: " in out, out
    else:
        assert done.returncode == 0 and "intact: 50 lines" in out, out + done.stderr.decode()
