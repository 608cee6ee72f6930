"""The scrub addon's patterns are compiled once per set of values, not per response (with 1,000
credentials a rebuild per response took ~70% of the proxy's CPU), and rebuilt exactly when a
value changed (addons/scrubpairs.py ``pairs``, ``PairCache``; proxy/core/scrubmatch.py
``compile_pairs``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from addons import scrubpairs
from addons.scrubpairs import PairCache, pairs
from proxy.core.claimindex import ClaimIndex
from proxy.core.hosts import HostPattern
from proxy.core.policy import Claim, Credential
from proxy.core.scrub import Scrubber
from proxy.core.secrets import Secret
from proxy.rules.sources import ValueSource
from proxy.store.registry import StoreValue

PH = "surr_ScrubTablePlaceholder0001"


def _claim(tmp: Path, value: str | None) -> Claim:
    if value is not None:
        (tmp / "v").write_text(value + "\n")
    cred = Credential("k", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp), None)
    return Claim.build("c", "p", None, (cred,))  # type: ignore[arg-type]  # no token needed here


def _scrubber(claim: Claim) -> Scrubber:
    return Scrubber(pairs(claim, time.time()))


def test_the_patterns_are_compiled_once_per_set_of_values(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "SecretValueOne123")
    first, second = _scrubber(claim), _scrubber(claim)
    assert first._c is second._c and first._c is not None
    assert first.scrub(b"x SecretValueOne123 y") == f"x {PH} y".encode()


def test_a_changed_value_file_rebuilds_them_and_the_old_value_stays_scrubbed(tmp_path: Path) -> None:
    claim = _claim(tmp_path, "SecretValueOne123")
    first = _scrubber(claim)
    (tmp_path / "v").write_text("SecretValueTwo4567\n")
    os.utime(tmp_path / "v", ns=(1, 1))  # a different mtime even within the clock's resolution
    second = _scrubber(claim)
    assert second._c is not first._c
    assert second.scrub(b"SecretValueTwo4567 SecretValueOne123") == f"{PH} {PH}".encode()


def test_an_unreadable_value_is_not_kept_out_for_good(tmp_path: Path) -> None:
    claim = _claim(tmp_path, None)  # the file does not exist yet
    assert _scrubber(claim).scrub(b"SecretValueLate999") == b"SecretValueLate999"
    (tmp_path / "v").write_text("SecretValueLate999\n")
    assert _scrubber(claim).scrub(b"SecretValueLate999") == PH.encode()


def test_a_claims_pairs_are_kept_until_a_value_changes(tmp_path: Path) -> None:
    cache, claim = PairCache(), _claim(tmp_path, "SecretValueOne123")
    first = cache.get(claim, time.time())[0]
    assert cache.get(claim, time.time())[0] is first
    (tmp_path / "v").write_text("SecretValueTwo4567\n")
    os.utime(tmp_path / "v", ns=(2, 2))
    second = cache.get(claim, time.time())[0]
    assert second is not first and (b"SecretValueTwo4567", PH.encode()) in second


def test_many_secrets_are_all_found_leftmost_longest() -> None:
    """Thousands of secrets in one claim (one automaton, not one regex alternation), with one
    secret inside another: the longer one is replaced whole."""
    pairs = [(f"tok_{i:05d}_ValueOfSecret".encode(), f"surr_P{i:05d}".encode()) for i in range(3000)]
    pairs.append((b"tok_00042_ValueOfSecret_and_more", b"surr_LONG"))
    s = Scrubber(pairs)
    text = b"a tok_02999_ValueOfSecret b tok_00042_ValueOfSecret_and_more c tok_00007_ValueOfSecret"
    assert s.scrub(text) == b"a surr_P02999 b surr_LONG c surr_P00007"


def _stored(name: str, value: str) -> Credential:
    """A store credential whose value is already read (no store is asked: the value is cached)."""
    source = StoreValue(None, "big", name, _cached=(Secret(value), 1), _history=[])  # type: ignore[arg-type]
    return Credential(name, f"surr_Many{name:0>21}", (HostPattern.parse("api.test"),), source)


def test_a_write_to_one_of_many_credentials_extends_the_patterns_instead_of_compiling_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 14: a new Claim object for a claim of 2,000 credentials (one value replaced, one
    added, one deleted) does not compile every value again: the patterns are extended; the new
    values are scrubbed, so are the old and deleted ones (never worse than passing them), and
    the old Claim object (a WebSocket opened before the write) keeps its own patterns. Past the
    bound of pairs added or gone, the claim is compiled whole again."""
    compiled: list[int] = []
    whole = scrubpairs.compile_pairs

    def counting(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool = True) -> Any:
        compiled.append(len(pairs))
        return whole(pairs, escapes)

    monkeypatch.setattr(scrubpairs, "compile_pairs", counting)
    index = ClaimIndex(_stored(f"k{n:04d}", f"ManyValue{n:04d}xyz") for n in range(2000))
    cache, now = PairCache(), time.time()
    first = index.claim("big", "p", None)  # type: ignore[arg-type]  # no token needed here
    before = cache.get(first, now)[1]
    assert compiled == [2000]
    index.put(_stored("k0007", "ReplacedValue7xyz"))
    index.put(_stored("new", "AddedValueNewxyz"))
    index.remove("k0008")
    second = index.claim("big", "p", None)  # type: ignore[arg-type]
    after = cache.get(second, now)[1]
    assert compiled == [2000] and after is not before  # extended, not compiled again
    text = b"ReplacedValue7xyz AddedValueNewxyz ManyValue0007xyz ManyValue0008xyz ManyValue1999xyz"
    assert Scrubber((), compiled=after).scrub(text) == (
        b"surr_Many0000000000000000k0007 surr_Many000000000000000000new surr_Many0000000000000000k0007 "
        b"surr_Many0000000000000000k0008 surr_Many0000000000000000k1999"
    )
    assert cache.get(first, now)[1] is before and cache.get(second, now)[1] is after
    for n in range(40):  # past max(32, 2000 // 64) pairs added: compiled whole again
        index.put(_stored(f"k{n:04d}", f"Rotated{n:04d}Valuexyz"))
    third = cache.get(index.claim("big", "p", None), now)[1]  # type: ignore[arg-type]
    assert compiled == [2000, 2001]  # k0008 is back
    assert Scrubber((), compiled=third).scrub(b"Rotated0039Valuexyz") == b"surr_Many0000000000000000k0039"
