"""proxy.core.claimindex: a claim's views kept per credential equal Claim.build's after any
sequence of puts and removes, every field (a field added to Claim.build and not to the index
fails here), placeholder collisions and a sigv4 credential's extra placeholders included."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.claimindex import ClaimIndex
from proxy.core.oauth import parse_spec
from proxy.core.policy import Claim, Credential, Injection, Misplaced, SourceToken, Surface
from proxy.core.secrets import Secret
from proxy.core.sigv4 import Allowed, SigV4Spec


class Value:
    def current(self) -> tuple[Secret, int]:
        return Secret("v"), 1


OAUTH = parse_spec({"token_endpoint": {"host": "api.test", "path": "/token"}, "access_token": "a"})
NAMES = [f"k{i}" for i in range(6)]
PLACEHOLDERS = [f"surr_Placeholder{i:012d}" for i in range(5)]  # few: collisions happen


@st.composite
def credentials(draw: st.DrawFn) -> Credential:
    sigv4 = None
    if draw(st.booleans()):
        sigv4 = SigV4Spec(draw(st.sampled_from(PLACEHOLDERS)), draw(st.sampled_from([None, *PLACEHOLDERS])),
                          Allowed(frozenset("*"), frozenset("*")))  # fmt: skip
    return Credential(
        draw(st.sampled_from(NAMES)),
        draw(st.sampled_from(PLACEHOLDERS)),
        (),
        Value(),
        Injection("authorization", "Bearer {value}") if draw(st.booleans()) else None,
        max_requests=draw(st.sampled_from([None, 3])),
        surfaces=draw(st.sampled_from([frozenset({Surface.HEADER}), frozenset({Surface.BODY})])),
        on_misplaced=draw(st.sampled_from(list(Misplaced))),
        oauth=OAUTH if draw(st.booleans()) else None,
        sigv4=sigv4,
    )


def _ids(value: Any) -> Any:
    """A field's value with each credential by identity (equal fields are not the same object)."""
    if isinstance(value, tuple) and value and isinstance(value[0], Credential):
        return tuple(id(c) for c in value)
    if isinstance(value, dict):
        return {k: id(v) for k, v in value.items()}
    return value


def _fields(claim: Claim) -> dict[str, Any]:
    return {f.name: _ids(getattr(claim, f.name)) for f in dataclasses.fields(claim)}


OPS = st.lists(st.one_of(credentials(), st.sampled_from(NAMES)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_the_claim_of_an_index_equals_claim_build_of_its_credentials(ops: list[Credential | str]) -> None:
    token = SourceToken("t")
    index = ClaimIndex()
    held: dict[str, Credential] = {}
    for op in ops:
        if isinstance(op, str):
            index.remove(op)
            held.pop(op, None)
        else:
            index.put(op)
            held[op.name] = op
        built = Claim.build("c", "p", token, tuple(held[n] for n in sorted(held)), "store")
        assert _fields(index.claim("c", "p", token, "store")) == _fields(built)
        assert len(index) == len(held) and all(index.get(n) is c for n, c in held.items())


def test_a_claim_taken_is_a_snapshot_later_changes_do_not_reach() -> None:
    first = Credential("a", PLACEHOLDERS[0], (), Value())
    index = ClaimIndex([first])
    before = index.claim("c", "p", SourceToken("t"))
    index.remove("a")
    index.put(Credential("b", PLACEHOLDERS[1], (), Value(), max_requests=1))
    assert before.credentials == (first,) and list(before.by_placeholder) == [PLACEHOLDERS[0].encode()]
    assert before.metered == () and index.get("a") is None
