"""Fuzzing placeholder scanning and substitution (issue 5): on random header fields and request
targets, ``placeholders.find`` and ``substitute_request`` raise nothing (substitution documents
that it raises nothing: refusals are values), and a registered placeholder never yields its secret
toward a host the credential is not bound to, nor over cleartext. ``Scrubber`` output does not
depend on chunking and never holds the secret."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import placeholders
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Injection
from proxy.core.scrub import Scrubber
from proxy.core.substitute import substitute_request
from proxy.rules.sources import ValueSource

SECRET = "FUZZsecretForSubstitution0123456789"
INJECTED = "FUZZinjectedSecret9876543210"
PH = placeholders.generate()
INJ_PH = placeholders.generate()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def creds() -> Iterator[tuple[Credential, Credential]]:
    with tempfile.TemporaryDirectory(prefix="subst-fuzz-") as d:
        tmp = Path(d)
        (tmp / "k").write_text(SECRET + "\n")
        (tmp / "inj").write_text(INJECTED + "\n")
        bound = (HostPattern.parse("bound.test"), HostPattern.parse("*.wild.test"))
        yield (
            Credential("k", PH, bound, ValueSource.parse("file:k", tmp)),
            Credential(
                "inj", INJ_PH, bound, ValueSource.parse("file:inj", tmp), Injection("X-Inj", "T {value}")
            ),
        )


def _spellings(ph: str) -> st.SearchStrategy[bytes]:
    raw = ph.encode()
    return st.sampled_from(
        [
            raw,
            b"Bearer " + raw,
            b"Basic " + base64.b64encode(b"user:" + raw),
            b"basic\t" + base64.b64encode(raw + b":x").rstrip(b"="),
            quote(ph, safe="").replace("_", "%5F").encode(),
            raw[:-1],  # a prefix: not a placeholder
            raw + b"Z",  # a longer run: not this placeholder
            raw.upper(),
        ]
    )


_fragment = st.one_of(st.binary(max_size=24), _spellings(PH), _spellings(INJ_PH), st.just(b"surr_"))
_value = st.lists(_fragment, max_size=5).map(b"".join)
_name = st.sampled_from([b"Authorization", b"X-Api-Key", b"Cookie", b"X-Inj", b"x-inj", b"Host"]) | st.binary(
    min_size=1, max_size=12
)
_fields = st.lists(st.tuples(_name, _value), max_size=6)
_target = st.lists(st.one_of(st.binary(max_size=16), _spellings(PH), st.just(b"/p?q=")), max_size=4).map(
    b"".join
)
_host = st.sampled_from(
    ["bound.test", "a.wild.test", "wild.test", "other.test", "bound.test.evil", "127.0.0.1"]
)


@given(st.binary(max_size=2000) | _value)
def test_find_never_raises_and_returns_placeholder_shaped_runs(value: bytes) -> None:
    for m in placeholders.find(value):
        assert placeholders.is_placeholder(m.group().decode("ascii"))


@FUZZ
@given(_fields, _target, _host, st.booleans())
def test_substitution_never_raises_and_never_sends_a_secret_where_it_may_not_go(
    creds: tuple[Credential, Credential],
    fields: list[tuple[bytes, bytes]],
    target: bytes,
    host: str,
    tls: bool,
) -> None:
    cred, inj = creds
    by_placeholder = {PH.encode(): cred, INJ_PH.encode(): inj}
    out = substitute_request(fields, target, host, tls, by_placeholder, [inj])
    if out.refusal is not None:
        assert out.fields is None
        return
    sent = b"".join(n + b"\0" + v for n, v in (out.fields or fields))
    allowed = tls and cred.bound_to(host)
    if not allowed:
        assert SECRET.encode() not in sent and INJECTED.encode() not in sent
        assert out.used == {}
    if out.fields is None:
        assert SECRET.encode() not in sent  # unchanged: the sandbox never had it


@FUZZ
@given(st.lists(st.binary(max_size=40) | st.just(SECRET.encode()), max_size=8), st.data())
def test_scrubber_output_is_independent_of_chunking(parts: list[bytes], data: st.DataObject) -> None:
    body = b"".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    pairs = [(SECRET.encode(), PH.encode()), (SECRET[:12].encode() + b"X", INJ_PH.encode())]
    whole, streamed = Scrubber(pairs), Scrubber(pairs)
    once = whole.feed(body) + whole.finish()
    pieces = b"".join(streamed.feed(c) for c in chunks) + streamed.finish()
    assert pieces == once
    assert SECRET.encode() not in pieces
