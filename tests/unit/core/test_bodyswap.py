"""proxy.core.bodyswap: what each placeholder in a request body becomes as it streams, and the
refusals that close the connection (the head has already left)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from proxy.core.bodyswap import BodyRefused, BodyResolver
from proxy.core.decide import Reason
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Misplaced, Surface
from proxy.rules.sources import ValueSource

PH = "surr_BodySwapPlaceholder000001"
SECRET = 'se"cr&t'


@pytest.fixture
def cred(tmp_path: Path) -> Credential:
    (tmp_path / "v").write_text(SECRET + "\n")
    source = ValueSource.parse("file:v", tmp_path)
    return Credential("b", PH, (HostPattern.parse("api.test"),), source, surfaces=frozenset({Surface.BODY}))


def _resolver(cred: Credential, how: str = "json", tls: bool = True, host: str = "api.test", **kw: object):  # type: ignore[no-untyped-def]
    return BodyResolver({PH.encode(): cred}, host, tls, how, 0.0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("how", "escaped"), [("json", b'se\\"cr&t'), ("form", b"se%22cr%26t")])
def test_a_placeholder_becomes_the_secret_escaped_for_the_body(
    cred: Credential, how: str, escaped: bytes
) -> None:
    resolver = _resolver(cred, how)
    assert resolver(PH.encode()) == escaped
    assert resolver.outcome.used == {"b": 1}


def test_a_string_of_the_placeholder_format_not_of_this_claim_is_left_alone(cred: Credential) -> None:
    assert _resolver(cred)(b"surr_SomebodyElsesPlaceholder1") is None


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"tls": False}, Reason.CLEARTEXT_CREDENTIAL),
        ({"host": "evil.test", "block": True}, Reason.PLACEHOLDER_VIOLATION),  # carry would pass it
        ({"spend": lambda c: False}, Reason.CREDENTIAL_BUDGET_SPENT),
    ],
    ids=["cleartext", "unbound-host", "budget-spent"],
)
def test_a_refusal_raises_before_the_secret_is_written(cred: Credential, kw: dict, reason: Reason) -> None:
    if kw.pop("block", False):
        cred = dataclasses.replace(cred, on_misplaced=Misplaced.BLOCK)
    resolver = _resolver(cred, **kw)
    with pytest.raises(BodyRefused) as e:
        resolver(PH.encode())
    outcome = e.value.outcome
    assert outcome.refusal is not None and outcome.refusal.reason is reason
    assert (outcome.terminate, outcome.used, outcome.violation_surface) == (True, {}, "body")
