"""The scrub addon compiles a claim's scrub table once, and rebuilds it exactly when a value may
have changed (addons/scrub.py ``_Tables``)."""

from __future__ import annotations

import os
from pathlib import Path

from addons.scrub import _Tables
from proxy.hosts import HostPattern
from proxy.policy import Claim, Credential
from proxy.scrub import Scrubber
from proxy.secrets import ValueSource

PH = "surr_ScrubTablePlaceholder0001"


def _claim(tmp: Path, value: str | None) -> Claim:
    if value is not None:
        (tmp / "v").write_text(value + "\n")
    cred = Credential("k", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp), None)
    return Claim.build("c", "p", None, (cred,))  # type: ignore[arg-type]  # no token needed here


def _scrub(tables: _Tables, claim: Claim, text: bytes) -> bytes:
    return Scrubber(tables.get(claim)).scrub(text)


def test_the_table_is_built_once_per_claim(tmp_path: Path) -> None:
    tables, claim = _Tables(), _claim(tmp_path, "SecretValueOne123")
    first = tables.get(claim)
    assert tables.get(claim) is first
    assert _scrub(tables, claim, b"x SecretValueOne123 y") == f"x {PH} y".encode()


def test_a_changed_value_file_rebuilds_it(tmp_path: Path) -> None:
    tables, claim = _Tables(), _claim(tmp_path, "SecretValueOne123")
    first = tables.get(claim)
    (tmp_path / "v").write_text("SecretValueTwo4567\n")
    os.utime(tmp_path / "v", ns=(1, 1))  # a different mtime even within the clock's resolution
    assert tables.get(claim) is not first
    assert _scrub(tables, claim, b"SecretValueTwo4567") == PH.encode()


def test_a_new_claim_object_gets_its_own_table(tmp_path: Path) -> None:
    tables = _Tables()
    first = tables.get(_claim(tmp_path, "SecretValueOne123"))
    assert tables.get(_claim(tmp_path, "SecretValueOne123")) is not first


def test_an_unreadable_value_is_not_kept_out_for_good(tmp_path: Path) -> None:
    tables, claim = _Tables(), _claim(tmp_path, None)  # the file does not exist yet
    assert _scrub(tables, claim, b"SecretValueLate999") == b"SecretValueLate999"
    (tmp_path / "v").write_text("SecretValueLate999\n")
    assert _scrub(tables, claim, b"SecretValueLate999") == PH.encode()
