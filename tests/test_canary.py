"""tests/canary.py: the scan finds a canary in each form it claims to, and only there."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote

import pytest
from canary import assert_absent, find, forms, scan_tree

VALUE = "CANARYselftest0123456789abcdef0123"  # not made with canary.make: the session scan ignores it


def _percent_all(value: str) -> str:
    return "".join(f"%{b:02X}" for b in value.encode())


ENCODED = [
    (VALUE.encode(), "raw"),
    (b"Authorization: Basic " + base64.b64encode(f"user:{VALUE}".encode()), "basic-credentials"),
    (base64.b64encode(f"x{VALUE}".encode()), "base64-offset-1"),
    (base64.b64encode(f"xy{VALUE}".encode()), "base64-offset-2"),
    (base64.urlsafe_b64encode(f"\xff\xfe{VALUE}".encode()), "base64url"),
    (_percent_all(VALUE).encode(), "percent-every-byte"),
    (_percent_all(VALUE).lower().encode(), "percent-lower"),
    (quote(VALUE).encode(), "percent-as-quote-does"),
    (json.dumps(VALUE, ensure_ascii=True).encode(), "json"),
    ("".join(f"\\u{ord(c):04x}" for c in VALUE).encode(), "json-escaped"),
]


@pytest.mark.parametrize("data", [d for d, _ in ENCODED], ids=[i for _, i in ENCODED])
def test_every_form_is_found(data: bytes) -> None:
    assert find(b"prefix " + data + b" suffix", [VALUE])


def test_nothing_is_found_in_unrelated_bytes() -> None:
    assert find(b"CANARYselftest but not the rest " + base64.b64encode(b"CANARY"), [VALUE]) == []


def test_forms_never_include_an_empty_pattern() -> None:
    assert all(forms("CANARYx" + "0" * 24).values())


def test_scan_tree_reports_the_file_and_form_but_never_the_value(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "audit.jsonl").write_text(json.dumps({"h": base64.b64encode(VALUE.encode()).decode()}))
    (tmp_path / "clean.txt").write_text("nothing here")
    source = tmp_path / "secret"
    source.write_text(VALUE)
    hits = scan_tree(tmp_path, [VALUE], exempt=[source])
    assert len(hits) == 1 and "audit.jsonl" in hits[0] and "base64" in hits[0]
    assert VALUE not in hits[0]
    assert len(scan_tree(tmp_path, [VALUE])) == 2  # the source file too, when not exempted


def test_assert_absent_names_the_artifact() -> None:
    with pytest.raises(AssertionError, match="client bytes: CANARYself"):
        assert_absent({"client bytes": VALUE.encode()}, [VALUE])
    assert_absent({"client bytes": b"clean"}, [VALUE])


OTHER = "canary-not-spelled-like-the-others-0123456789"  # as tests/unit/store registers one


@pytest.mark.parametrize("offset", [0, 1, 7, 33, 65])
@pytest.mark.parametrize("form", ["raw", "base64+1", "json-escaped"])
def test_a_form_across_a_read_chunk_boundary_is_found(tmp_path: Path, offset: int, form: str) -> None:
    """The scan streams files in chunks: a form that starts ``offset`` bytes before a chunk ends
    is still found (the chunks overlap by the longest form less one byte)."""
    chunk = 4096
    spelled = forms(VALUE)[form]
    path = tmp_path / "big.bin"
    path.write_bytes(b"\0" * (chunk - offset) + spelled + b"\xff" * chunk)
    from canary import _Index

    assert _Index([VALUE, OTHER]).find_file(path, chunk=chunk) == [f"CANARYself… as {form}"]


def test_many_values_of_unlike_spellings_each_found_in_their_file(tmp_path: Path) -> None:
    """One automaton for every form of every value: values that share no prefix (a registered
    constant beside ``CANARY…`` ones) are each found, in the file that holds them only."""
    values = [f"CANARYmany{i:03d}{'ab' * 12}" for i in range(300)] + [OTHER]
    for i in (0, 150, 299):
        (tmp_path / f"f{i}").write_bytes(b"x" + base64.b64encode(b"k:" + values[i].encode()) + b"y")
    (tmp_path / "other").write_text(json.dumps({"v": quote(OTHER, safe="")}))
    (tmp_path / "clean").write_bytes(b"CANARYmany" * 1000)
    hits = scan_tree(tmp_path, values)
    assert sorted(h.split(": ")[0].rsplit("/", 1)[1] for h in hits) == ["f0", "f150", "f299", "other"]


def test_identical_files_are_each_reported(tmp_path: Path) -> None:
    """Binary-identical files are searched once, but every one of them is reported."""
    for name in ("one", "two", "three"):
        (tmp_path / name).write_text(f"token={VALUE}")
    (tmp_path / "clean").write_text("token=none")
    hits = scan_tree(tmp_path, [VALUE])
    assert sorted(h.split(": ")[0].rsplit("/", 1)[1] for h in hits) == ["one", "three", "two"]


_INNER = '''
import canary

def test_writes(tmp_path):
    (tmp_path / "out.log").write_text("token=" + canary.make("inner{leak}"))

def test_other(tmp_path):
    (tmp_path / "clean.log").write_text("nothing")
'''


def test_the_scan_covers_every_xdist_worker_and_fails_the_session(pytester: pytest.Pytester) -> None:
    """Under ``-n 2`` the canaries and the files are the workers'; a worker's exit status is
    ignored by xdist's controller. A file a worker's test wrote with a canary fails the session
    and is named (the clean case is every ``make test`` run: the controller prints each worker's
    line)."""
    leak = True
    here = Path(__file__).parent
    for name in ("conftest.py", "canary.py", "pg.py", "schedule.py", "unixconnect.py"):
        (pytester.path / name).write_text((here / name).read_text())
    body = _INNER.replace("{leak}", "") if leak else _INNER.replace('canary.make("inner{leak}")', '"none"')
    body = "import canary\ncanary.make('unused')\n" + body  # every worker has a canary to scan for
    pytester.makepyfile(test_inner=body)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-q")
    out = result.stdout.str()
    assert "[gw" in out and "canary secrets" in out, out
    if leak:
        assert result.ret == pytest.ExitCode.TESTS_FAILED and "LEAK" in out and "out.log" in out, out
    else:
        assert result.ret == pytest.ExitCode.OK and "LEAK" not in out, out
