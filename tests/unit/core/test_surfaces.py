"""proxy.core.substitute: surfaces per credential (query, userinfo/Basic, body) and on_misplaced."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from proxy.core import bodies
from proxy.core.decide import Action, Reason
from proxy.core.hosts import HostPattern
from proxy.core.policy import DEFAULT_SURFACES, Credential, Misplaced, Surface
from proxy.core.substitute import BodyRefused, BodyResolver, Outcome, substitute_request
from proxy.rules.sources import ValueSource

P = "surr_SurfacePlaceholder0000000001"
SECRET = 'k&y=v+a l"u\\e/ü'  # every character a query, form or JSON body must escape
HOST = "api.test"


def cred(
    tmp: Path, surfaces: Sequence[Surface] = tuple(DEFAULT_SURFACES), misplaced: str = "carry"
) -> Credential:
    (tmp / "value").write_text(SECRET + "\n", encoding="utf-8")
    return Credential(
        "svc",
        P,
        (HostPattern.parse(HOST),),
        ValueSource.parse("file:value", tmp),
        surfaces=frozenset(surfaces),
        on_misplaced=Misplaced(misplaced),
    )


def run(
    c: Credential, fields: Sequence[tuple[str, str]] = (), target: str = "/", host: str = HOST
) -> Outcome:
    raw = [(n.encode(), v.encode()) for n, v in fields]
    return substitute_request(raw, target.encode(), host, True, {P.encode(): c}, [])


def _basic(userpass: str) -> str:
    return "Basic " + base64.b64encode(userpass.encode()).decode()


# --- query ------------------------------------------------------------------------------------

QUERY = [
    pytest.param(f"/v1?key={P}&b=2", id="raw"),
    pytest.param(f"/v1?key={P.replace('_', '%5F')}&b=2", id="percent-encoded-underscore"),
    pytest.param("/v1?key=" + "".join(f"%{b:02x}" for b in P.encode()) + "&b=2", id="all-encoded-lowercase"),
]


@pytest.mark.parametrize("target", QUERY)
def test_query_placeholder_is_swapped_percent_encoded(tmp_path: Path, target: str) -> None:
    out = run(cred(tmp_path, [Surface.QUERY]), target=target)
    assert out.refusal is None and out.target is not None
    assert out.target.startswith(b"/v1?key=")
    assert parse_qs(urlsplit(out.target.decode()).query) == {"key": [SECRET], "b": ["2"]}
    assert out.used == {"svc": 1} and out.carried == []


def test_query_placeholder_without_the_query_surface_is_carried(tmp_path: Path) -> None:
    out = run(cred(tmp_path), target=f"/v1?key={P}")
    assert (out.target, out.refusal) == (None, None)
    assert out.carried_on == [("svc", "query")]


def test_query_placeholder_toward_an_unbound_host_is_a_violation_even_when_enabled(tmp_path: Path) -> None:
    out = run(cred(tmp_path, [Surface.QUERY]), target=f"/v1?key={P}", host="evil.test")
    assert out.refusal is not None and out.refusal.action is Action.VIOLATION
    assert (out.violated, out.violation_surface) == ("svc", "query")


def test_placeholder_in_the_path_is_never_swapped(tmp_path: Path) -> None:
    every = [Surface.QUERY, Surface.HEADER, Surface.BODY]
    out = run(cred(tmp_path, every), target=f"/files/{P}/x")
    assert out.target is None and out.carried_on == [("svc", "path")]


# --- userinfo / Basic ---------------------------------------------------------------------------


@pytest.mark.parametrize("surface", [Surface.BASIC, Surface.USERINFO])
def test_userinfo_enables_the_basic_credentials_clients_build_from_a_url(
    tmp_path: Path, surface: Surface
) -> None:
    out = run(cred(tmp_path, [surface]), [("Authorization", _basic(f"x-access-token:{P}"))])
    assert out.fields is not None
    token = out.fields[0][1].split(b" ", 1)[1]
    assert base64.b64decode(token).decode() == f"x-access-token:{SECRET}"


def test_basic_placeholder_with_only_the_header_surface_is_carried(tmp_path: Path) -> None:
    out = run(cred(tmp_path, [Surface.HEADER]), [("Authorization", _basic(f"u:{P}"))])
    assert out.refusal is None and out.carried_on == [("svc", "basic")]


# --- on_misplaced in the request head ----------------------------------------------------------

MISPLACED = [
    pytest.param("carry", None, False, id="carry"),
    pytest.param("block", Reason.PLACEHOLDER_MISPLACED, False, id="block"),
    pytest.param("terminate", Reason.PLACEHOLDER_MISPLACED, True, id="terminate"),
]


@pytest.mark.parametrize(("misplaced", "reason", "terminate"), MISPLACED)
def test_header_placeholder_on_a_disabled_surface_follows_on_misplaced(
    tmp_path: Path, misplaced: str, reason: Reason | None, terminate: bool
) -> None:
    out = run(cred(tmp_path, [Surface.QUERY], misplaced), [("X-Key", P)])
    assert out.fields is None  # never swapped
    assert (out.refusal.reason if out.refusal else None, out.terminate) == (reason, terminate)
    if reason is None:
        assert out.carried_on == [("svc", "header")]
    else:
        assert out.refusal is not None and out.refusal.action is Action.DENY
        assert (out.violated, out.violation_surface) == ("svc", "header")


@pytest.mark.parametrize("misplaced", ["carry", "block", "terminate"])
def test_header_placeholder_toward_an_unbound_host_is_always_a_violation(
    tmp_path: Path, misplaced: str
) -> None:
    out = run(cred(tmp_path, misplaced=misplaced), [("X-Key", P)], host="other.test")
    assert out.refusal is not None
    assert (out.refusal.reason, out.terminate, out.violation_surface) == (
        Reason.PLACEHOLDER_VIOLATION,
        False,
        "header",
    )


# --- bodies ------------------------------------------------------------------------------------


def body(
    c: Credential, data: bytes, how: str = "raw", host: str = HOST, tls: bool = True
) -> tuple[bytes, Outcome]:
    resolver = BodyResolver({P.encode(): c}, host, tls, how, 0.0)
    s = bodies.Swapper(resolver)
    return s.feed(data) + s.finish(), resolver.outcome


PB = P.encode()
SWAP_CHECKS = [
    pytest.param("json", b'{"t": "' + PB + b'"}', lambda b: json.loads(b) == {"t": SECRET}, id="json"),
    pytest.param(
        "form", b"a=1&t=" + PB, lambda b: parse_qs(b.decode()) == {"a": ["1"], "t": [SECRET]}, id="form"
    ),
    pytest.param("raw", b"t=" + PB, lambda b: b == b"t=" + SECRET.encode(), id="raw"),
]


@pytest.mark.parametrize(("how", "data", "check"), SWAP_CHECKS)
def test_body_placeholder_is_swapped_escaped_for_the_media_type(
    tmp_path: Path, how: str, data: bytes, check: Callable[[bytes], bool]
) -> None:
    out, outcome = body(cred(tmp_path, [Surface.BODY]), data, how)
    assert check(out)
    assert outcome.used == {"svc": 1}


BODY_CASES = [
    pytest.param([Surface.HEADER], "carry", HOST, None, id="bound-not-enabled-carry"),
    pytest.param([Surface.HEADER], "block", HOST, Reason.PLACEHOLDER_MISPLACED, id="bound-not-enabled-block"),
    pytest.param(
        [Surface.HEADER], "terminate", HOST, Reason.PLACEHOLDER_MISPLACED, id="bound-not-enabled-terminate"
    ),
    pytest.param([Surface.BODY], "carry", "model.test", None, id="unbound-carry"),
    pytest.param([Surface.BODY], "block", "model.test", Reason.PLACEHOLDER_VIOLATION, id="unbound-block"),
]


@pytest.mark.parametrize(("surfaces", "misplaced", "host", "reason"), BODY_CASES)
def test_body_placeholder_not_swapped_follows_on_misplaced(
    tmp_path: Path, surfaces: list[Surface], misplaced: str, host: str, reason: Reason | None
) -> None:
    c = cred(tmp_path, surfaces, misplaced)
    data = b'{"history": "the key is ' + P.encode() + b'"}'
    if reason is None:
        out, outcome = body(c, data, "json", host)
        assert out == data and outcome.carried_on == [("svc", "body")] and outcome.used == {}
        return
    with pytest.raises(BodyRefused) as e:
        body(c, data, "json", host)
    o = e.value.outcome
    assert o.refusal is not None and o.refusal.reason is reason and o.terminate
    assert (o.violated, o.violation_surface) == ("svc", "body")


def test_body_swap_over_cleartext_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BodyRefused) as e:
        body(cred(tmp_path, [Surface.BODY]), P.encode(), tls=False)
    assert e.value.outcome.refusal is not None
    assert e.value.outcome.refusal.reason is Reason.CLEARTEXT_CREDENTIAL


def test_body_with_an_unreadable_secret_is_refused(tmp_path: Path) -> None:
    c = cred(tmp_path, [Surface.BODY])
    (tmp_path / "value").unlink()
    with pytest.raises(BodyRefused) as e:
        body(c, P.encode())
    assert e.value.outcome.refusal is not None
    assert e.value.outcome.refusal.reason is Reason.CREDENTIAL_UNAVAILABLE


def test_body_swap_counts_the_budget_once_and_a_spent_one_is_refused(tmp_path: Path) -> None:
    """Regression: a credential swapped only in a body was never counted against max_requests."""
    c = cred(tmp_path, [Surface.BODY])
    asked: list[str] = []

    def spend(budget: bool) -> Callable[[Credential], bool]:
        def count(x: Credential) -> bool:
            asked.append(x.name)
            return budget

        return count

    data = P.encode() + b" and again " + P.encode()
    resolver = BodyResolver({P.encode(): c}, HOST, True, "raw", 0.0, spend(True))
    s = bodies.Swapper(resolver)
    assert s.feed(data) + s.finish() == f"{SECRET} and again {SECRET}".encode()
    assert asked == ["svc"]  # one request, one count, however many placeholders
    refusing = BodyResolver({P.encode(): c}, HOST, True, "raw", 0.0, spend(False))
    with pytest.raises(BodyRefused) as e:
        bodies.Swapper(refusing).feed(data)
    o = e.value.outcome
    assert o.refusal is not None and o.refusal.reason is Reason.CREDENTIAL_BUDGET_SPENT and o.terminate
    assert o.used == {}


def test_unregistered_placeholder_in_a_body_is_left_alone(tmp_path: Path) -> None:
    data = b"surr_NotRegisteredAnywhere000004 and more"
    out, outcome = body(cred(tmp_path, [Surface.BODY], "terminate"), data)
    assert out == data and outcome == Outcome()


def test_may_swap_and_may_refuse(tmp_path: Path) -> None:
    c = cred(tmp_path, [Surface.BODY])
    assert BodyResolver({P.encode(): c}, HOST, True, "raw", 0).may_swap()
    assert not BodyResolver({P.encode(): c}, HOST, False, "raw", 0).may_swap()
    assert not BodyResolver({P.encode(): c}, "other.test", True, "raw", 0).may_swap()
    assert not BodyResolver({P.encode(): c}, HOST, True, "raw", 0).may_refuse()
    blocking = dataclasses.replace(c, on_misplaced=Misplaced.BLOCK)
    assert BodyResolver({P.encode(): blocking}, "other.test", True, "raw", 0).may_refuse()
