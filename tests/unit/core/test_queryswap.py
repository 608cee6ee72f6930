"""proxy.core.queryswap: placeholders in the request target: the path never swapped, the query
swapped raw or percent-encoded once, the secret escaped as a query component (RFC 3986 §3.4)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import pytest

from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Surface
from proxy.core.queryswap import registered, spelled, swap_query, target_hits
from proxy.rules.sources import ValueSource

PH = "surr_QuerySwapPlaceholder00001"


@pytest.fixture
def by_placeholder(tmp_path: Path) -> dict[bytes, Credential]:
    (tmp_path / "v").write_text("s\n")
    cred = Credential("q", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp_path))
    return {PH.encode(): cred}


@pytest.mark.parametrize(
    "query",
    [PH, PH.replace("_", "%5F"), PH.replace("_", "%5f"), "".join(f"%{b:02X}" for b in PH.encode())],
    ids=["raw", "upper-hex", "lower-hex", "every-byte"],
)
def test_every_single_percent_spelling_is_found_and_swapped(query: str, by_placeholder: dict) -> None:
    assert registered(query.encode(), by_placeholder) == list(by_placeholder.values())
    assert spelled(PH.encode()).fullmatch(query.encode())
    swapped = swap_query(b"a=1&k=" + query.encode() + b"&b=2", PH.encode(), "v&x=1+#")
    assert parse_qs(swapped.decode()) == {"a": ["1"], "k": ["v&x=1+#"], "b": ["2"]}


def test_a_longer_run_is_another_string() -> None:
    assert spelled(PH.encode()).search((PH + "x").encode()) is None


def test_the_path_is_never_swappable_and_other_spellings_of_the_query_are_not_either(
    by_placeholder: dict,
) -> None:
    double = PH.replace("_", "%255F").encode()  # percent-encoded twice
    hits = target_hits(b"/v1/" + PH.encode(), b"k=" + double, by_placeholder)
    assert [(h.surface, h.swappable) for h in hits] == [(Surface.PATH, False), (Surface.QUERY, False)]
    hits = target_hits(b"/v1", b"k=" + PH.encode(), by_placeholder)
    assert [(h.surface, h.swappable) for h in hits] == [(Surface.QUERY, True)]
