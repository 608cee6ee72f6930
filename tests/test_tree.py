"""The tree itself: no file git tracks holds a merge's conflict markers (several engineers merge
into one branch; a marker left in a Markdown or JSON file would pass every other check)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(rb"^(<{7} |={7}$|>{7} )", re.M)


def test_no_tracked_file_holds_a_conflict_marker() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    found = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and MARKER.search(path.read_bytes()):
            found.append(name)
    assert not found, f"conflict markers in {found}"


def test_the_marker_pattern_finds_a_marker() -> None:
    assert MARKER.search(b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> other\n")
    assert not MARKER.search(b"a heading\n=========\n")
