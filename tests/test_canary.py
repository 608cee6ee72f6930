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
