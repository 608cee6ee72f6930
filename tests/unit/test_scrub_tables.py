"""The scrub addon's patterns are compiled once per set of values, not per response (with 1,000
credentials a rebuild per response took ~70% of the proxy's CPU), and rebuilt exactly when a
value changed (addons/scrub.py ``_pairs``, proxy/scrub.py ``_compile``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from addons.scrub import _pairs
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


def _scrubber(claim: Claim) -> Scrubber:
    return Scrubber(_pairs(claim, time.time()))


def test_the_patterns_are_compiled_once_per_set_of_values(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "SecretValueOne123")
    first, second = _scrubber(claim), _scrubber(claim)
    assert first._full is second._full and first._full is not None
    assert first.scrub(b"x SecretValueOne123 y") == f"x {PH} y".encode()


def test_a_changed_value_file_rebuilds_them_and_the_old_value_stays_scrubbed(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "SecretValueOne123")
    first = _scrubber(claim)
    (tmp_path / "v").write_text("SecretValueTwo4567\n")
    os.utime(tmp_path / "v", ns=(1, 1))  # a different mtime even within the clock's resolution
    second = _scrubber(claim)
    assert second._full is not first._full
    assert second.scrub(b"SecretValueTwo4567 SecretValueOne123") == f"{PH} {PH}".encode()


def test_an_unreadable_value_is_not_kept_out_for_good(tmp_path: Path) -> None:
    claim = _claim(tmp_path, None)  # the file does not exist yet
    assert _scrubber(claim).scrub(b"SecretValueLate999") == b"SecretValueLate999"
    (tmp_path / "v").write_text("SecretValueLate999\n")
    assert _scrubber(claim).scrub(b"SecretValueLate999") == PH.encode()
