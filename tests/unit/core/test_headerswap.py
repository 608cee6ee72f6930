"""proxy.core.headerswap: every registered placeholder in a header field, and which of them may
be swapped (raw, in one of the credential's header slots or Basic parts)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from proxy.core.headerswap import header_hits
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Surface
from proxy.core.slots import BasicPart
from proxy.rules.sources import ValueSource

PH = "surr_HeaderSwapPlaceholder0001"


@pytest.fixture
def by_placeholder(tmp_path: Path) -> dict[bytes, Credential]:
    (tmp_path / "v").write_text("s\n")
    cred = Credential("h", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp_path))
    return {PH.encode(): cred}


def _b64(text: str, alphabet: bytes = b"+/") -> bytes:
    return base64.b64encode(text.encode(), alphabet)


AUTH, URLSAFE = b"Authorization", b"-_"
CASES = [
    # (id, name, value, [(surface, swappable, part)])
    ("nothing", b"Accept", b"*/*", []),
    ("bearer-in-a-slot", AUTH, f"Bearer {PH}".encode(), [(Surface.HEADER, True, None)]),
    ("outside-the-slots", b"Cookie", f"a={PH}".encode(), [(Surface.HEADER, False, None)]),
    ("basic-password", AUTH, b"Basic " + _b64(f"x:{PH}"), [(Surface.BASIC, True, BasicPart.PASSWORD)]),
    ("basic-user", AUTH, b"Basic " + _b64(f"{PH}:x"), [(Surface.BASIC, False, BasicPart.USER)]),
    ("basic-urlsafe", b"X-Other", b"Basic " + _b64(f"x:{PH}??", URLSAFE), [(Surface.BASIC, False, None)]),
    ("percent-encoded", AUTH, PH.replace("_", "%5F").encode(), [(Surface.HEADER, False, None)]),
    ("in-the-name", PH.encode(), b"1", [(Surface.HEADER, False, None)]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_header_hits(name: bytes, value: bytes, expected: list, by_placeholder: dict) -> None:
    hits = header_hits(3, name, value, by_placeholder)
    assert [(h.surface, h.swappable, h.part) for h in hits] == expected
    assert all(h.index == 3 and PH not in h.where for h in hits)  # the message never quotes it
