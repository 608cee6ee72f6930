"""proxy.core.slots via proxy.core.substitute: a credential is swapped only in its header slots (default: the
credential headers in use) and in its Basic parts (default: the password). Issue 13, class 4:
a placeholder in a header a host reflects (Origin, Referer, Cookie, X-Request-Id,
Sec-WebSocket-Protocol) or in the Basic user name is carried or refused, never swapped."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from proxy.core.decide import Reason
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Misplaced, Surface
from proxy.core.slots import DEFAULT_HEADER_NAMES, BasicPart, header_problem
from proxy.core.substitute import Outcome, substitute_request
from proxy.rules.sources import ValueSource

PH = "surr_SlotsTestPlaceholder00001"
SECRET = "slots_realSecretValue0001"


def _cred(tmp: Path, **kw: object) -> Credential:
    (tmp / "v").write_text(SECRET + "\n")
    return Credential("svc", PH, (HostPattern.parse("api.test"),), ValueSource.parse("file:v", tmp), **kw)  # type: ignore[arg-type]


def _run(cred: Credential, fields: list[tuple[str, str]], host: str = "api.test") -> Outcome:
    raw = [(n.encode(), v.encode()) for n, v in fields]
    return substitute_request(raw, b"/", host, True, {PH.encode(): cred}, [])


def _basic(userpass: str) -> str:
    return "Basic " + base64.b64encode(userpass.encode()).decode()


def _sent(out: Outcome) -> bytes:
    return b"".join(v for _, v in out.fields or [])


# Places a host reflects back; each held the secret before issue 13 (it swapped in any header).
REFLECTED = [
    ("Origin", f"https://{PH}.example"),
    ("Referer", f"https://app.test/?t={PH}"),
    ("Cookie", f"session={PH}"),
    ("X-Request-Id", PH),
    ("Sec-WebSocket-Protocol", f"chat, {PH}"),
    ("X-Forwarded-For", PH),
    ("User-Agent", f"agent/{PH}"),
]
BASIC_USER = ("Authorization", _basic(f"{PH}:x-oauth-basic"))


@pytest.mark.parametrize("field", [*REFLECTED, BASIC_USER], ids=[f[0] for f in REFLECTED] + ["basic-user"])
def test_a_placeholder_outside_the_default_slots_is_carried_never_swapped(
    tmp_path: Path, field: tuple[str, str]
) -> None:
    out = _run(_cred(tmp_path), [field])
    assert out.refusal is None and out.used == {}
    assert out.fields is None  # nothing rewritten: the placeholder leaves as it came
    surface = "basic" if field is BASIC_USER else "header"
    assert (out.carried, out.carried_on) == (["svc"], [("svc", surface)])


@pytest.mark.parametrize("field", [*REFLECTED, BASIC_USER], ids=[f[0] for f in REFLECTED] + ["basic-user"])
@pytest.mark.parametrize("action", [Misplaced.BLOCK, Misplaced.TERMINATE])
def test_a_placeholder_outside_the_slots_is_refused_as_on_misplaced_says(
    tmp_path: Path, field: tuple[str, str], action: Misplaced
) -> None:
    out = _run(_cred(tmp_path, on_misplaced=action), [field])
    assert out.refusal is not None and out.refusal.reason is Reason.PLACEHOLDER_MISPLACED
    assert out.terminate is (action is Misplaced.TERMINATE)
    assert "its headers: Api-Key, Authorization" in out.refusal.message
    assert SECRET not in out.refusal.message and out.fields is None


@pytest.mark.parametrize("name", DEFAULT_HEADER_NAMES)
@pytest.mark.parametrize("spell", [str, str.lower, str.upper], ids=["as-documented", "lower", "upper"])
def test_every_default_header_is_a_slot_in_any_case(tmp_path: Path, name: str, spell: object) -> None:
    header = spell(name)  # type: ignore[operator]
    out = _run(_cred(tmp_path), [(header, f"Bearer {PH}")])
    assert out.fields == [(header.encode(), f"Bearer {SECRET}".encode())]


def test_the_basic_password_is_swapped_and_the_user_name_is_not(tmp_path: Path) -> None:
    out = _run(_cred(tmp_path), [("Authorization", _basic(f"{PH}:{PH}"))])
    ((_, value),) = out.fields or [(b"", b"")]
    assert base64.b64decode(value.split()[1]) == f"{PH}:{SECRET}".encode()
    assert out.carried_on == [("svc", "basic")] and out.used == {"svc": 1}


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (frozenset({BasicPart.USER}), f"{SECRET}:{PH}"),
        (frozenset(BasicPart), f"{SECRET}:{SECRET}"),
        (frozenset({BasicPart.PASSWORD}), f"{PH}:{SECRET}"),
    ],
    ids=["user", "both", "password"],
)
def test_basic_parts_name_where_basic_credentials_are_swapped(
    tmp_path: Path, parts: frozenset[BasicPart], expected: str
) -> None:
    out = _run(_cred(tmp_path, basic_parts=parts), [("authorization", _basic(f"{PH}:{PH}"))])
    ((_, value),) = out.fields or [(b"", b"")]
    assert base64.b64decode(value.split()[1]).decode() == expected


def test_basic_credentials_without_a_colon_are_all_user_name(tmp_path: Path) -> None:
    """RFC 7617 §2: user-pass = user-id ":" password; without a colon there is no password."""
    out = _run(_cred(tmp_path), [("Authorization", _basic(PH))])
    assert out.fields is None and out.carried_on == [("svc", "basic")]


def test_named_headers_replace_the_default_list(tmp_path: Path) -> None:
    cred = _cred(tmp_path, headers=frozenset({"cookie", "dd-api-key"}))
    out = _run(cred, [("Cookie", f"s={PH}"), ("DD-API-KEY", PH), ("Authorization", f"Bearer {PH}")])
    assert out.fields == [
        (b"Cookie", f"s={SECRET}".encode()),
        (b"DD-API-KEY", SECRET.encode()),
        (b"Authorization", f"Bearer {PH}".encode()),  # not named: carried
    ]
    assert out.used == {"svc": 1} and out.carried == ["svc"]


def test_an_empty_header_list_swaps_in_no_header(tmp_path: Path) -> None:
    out = _run(_cred(tmp_path, headers=frozenset()), [("Authorization", f"Bearer {PH}")])
    assert out.fields is None and out.carried == ["svc"]


def test_without_the_header_surface_no_slot_swaps(tmp_path: Path) -> None:
    cred = _cred(tmp_path, surfaces=frozenset({Surface.QUERY}))
    out = _run(cred, [("Authorization", f"Bearer {PH}")])
    assert out.fields is None and out.carried == ["svc"]


@pytest.mark.parametrize("field", [*REFLECTED, BASIC_USER], ids=[f[0] for f in REFLECTED] + ["basic-user"])
def test_outside_the_slots_toward_an_unbound_host_is_still_a_violation(
    tmp_path: Path, field: tuple[str, str]
) -> None:
    out = _run(_cred(tmp_path), [field], host="other.test")
    assert out.refusal is not None and out.refusal.reason is Reason.PLACEHOLDER_VIOLATION


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("X-Api-Key", True),
        ("Cookie", True),
        ("Host", False),
        ("host", False),
        ("Content-Length", False),
        ("Transfer-Encoding", False),
        ("Proxy-Authorization", False),
        ("Connection", False),
        (":authority", False),
        ("a b", False),
        ("", False),
    ],
)
def test_which_headers_may_be_slots(name: str, ok: bool) -> None:
    assert (header_problem(name) is None) is ok


def test_a_longer_run_beside_the_placeholder_is_left_as_it_is(tmp_path: Path) -> None:
    """Only the placeholder is swapped, not the start of a longer string (``surr_…xyz``)."""
    out = _run(_cred(tmp_path), [("Authorization", f"Bearer {PH} {PH}xyz")])
    assert out.fields == [(b"Authorization", f"Bearer {SECRET} {PH}xyz".encode())]
