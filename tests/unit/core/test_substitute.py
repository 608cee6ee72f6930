"""proxy.core.substitute: placeholders swapped for secrets only toward bound hosts over TLS."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import tutils

from addons.substitute import _bodiless
from proxy.core.decide import Action, Reason
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential, Injection
from proxy.core.slots import DEFAULT_BASIC_PARTS, DEFAULT_HEADERS, BasicPart
from proxy.core.substitute import Outcome, substitute_request
from proxy.rules.sources import ValueSource

P_GH = "surr_GithubPlaceholder000000001"
P_NPM = "surr_NpmPlaceholder00000000000002"
P_INJ = "surr_InjectedPlaceholder0000003"
P_UNREG = "surr_NotRegisteredAnywhere000004"
GH_SECRET = "ghs_realGithubSecretValue1"
NPM_SECRET = "npm_realNpmSecretValue22"
INJ_SECRET = "inj_realInjectedSecret333"
ALL_SECRETS = (GH_SECRET, NPM_SECRET, INJ_SECRET)


@dataclass
class Creds:
    dir: Path
    github: Credential  # api.github.com, github.com; default slots
    npm: Credential  # api.github.com, *.npmjs.org; headers X-Npm-Token and Cookie, Basic user and password
    inject: Credential  # injects Authorization on api.example.com

    def by_placeholder(self) -> dict[bytes, Credential]:
        return {c.placeholder.encode(): c for c in (self.github, self.npm, self.inject)}


def _cred(
    tmp: Path,
    name: str,
    ph: str,
    hosts: Sequence[str],
    value: str,
    inject: Injection | None = None,
    headers: frozenset[str] = DEFAULT_HEADERS,
    basic_parts: frozenset[BasicPart] = DEFAULT_BASIC_PARTS,
) -> Credential:
    (tmp / name).write_text(value + "\n")
    return Credential(
        name,
        ph,
        tuple(HostPattern.parse(h) for h in hosts),
        ValueSource.parse(f"file:{name}", tmp),
        inject,
        headers=headers,
        basic_parts=basic_parts,
    )


def _make_creds(tmp: Path) -> Creds:
    return Creds(
        tmp,
        _cred(tmp, "github", P_GH, ["api.github.com", "github.com"], GH_SECRET),
        # npm names its own header and both Basic parts (the slots; github keeps the defaults)
        _cred(
            tmp,
            "npm",
            P_NPM,
            ["api.github.com", "*.npmjs.org"],
            NPM_SECRET,
            headers=frozenset({"x-npm-token", "cookie"}),
            basic_parts=frozenset(BasicPart),
        ),
        _cred(
            tmp, "inj", P_INJ, ["api.example.com"], INJ_SECRET, Injection("Authorization", "Bearer {value}")
        ),
    )


@pytest.fixture
def creds(tmp_path: Path) -> Creds:
    return _make_creds(tmp_path)


def run(
    creds: Creds,
    fields: Sequence[tuple[str, str]],
    *,
    target: str = "/",
    host: str = "api.github.com",
    tls: bool = True,
    inject: bool = False,
) -> Outcome:
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in fields]
    return substitute_request(
        raw, target.encode(), host, tls, creds.by_placeholder(), [creds.inject] if inject else []
    )


def _basic(userpass: str) -> str:
    return "Basic " + base64.b64encode(userpass.encode()).decode()


def _unbasic(value: bytes) -> str:
    scheme, _, token = value.partition(b" ")
    assert scheme.lower() == b"basic"
    return base64.b64decode(token).decode()


# --- swaps ----------------------------------------------------------------------------------

SWAPS = [
    (("Authorization", f"Bearer {P_GH}"), f"Bearer {GH_SECRET}", "bearer"),
    (("Authorization", f"token {P_GH}"), f"token {GH_SECRET}", "token-scheme"),
    (("X-Api-Key", P_GH), GH_SECRET, "bare-header-value"),
    (("Authorization", f"Bearer {P_GH} {P_GH}"), f"Bearer {GH_SECRET} {GH_SECRET}", "twice-in-one-value"),
    (("x-goog-api-key", P_GH), GH_SECRET, "another-default-header-any-case"),
    (("PRIVATE-TOKEN", P_GH), GH_SECRET, "upper-case-default-header"),
]


@pytest.mark.parametrize(("field", "expected"), [r[:2] for r in SWAPS], ids=[r[2] for r in SWAPS])
def test_placeholder_in_a_header_is_swapped_toward_a_bound_host(
    creds: Creds, field: tuple[str, str], expected: str
) -> None:
    out = run(creds, [("Host", "api.github.com"), field, ("Accept", "*/*")])
    assert out.refusal is None
    assert out.fields == [
        (b"Host", b"api.github.com"),
        (field[0].encode(), expected.encode()),
        (b"Accept", b"*/*"),
    ]
    assert out.used == {"github": 1}


BASIC = [
    (f"x-access-token:{P_GH}", f"x-access-token:{GH_SECRET}", "placeholder-as-password"),
    (f"{P_NPM}:x-oauth-basic", f"{NPM_SECRET}:x-oauth-basic", "placeholder-as-user-when-named"),
    (f"{P_NPM}:{P_GH}", f"{NPM_SECRET}:{GH_SECRET}", "two-credentials-user-and-password"),
    (f"{P_NPM}:{P_NPM}", f"{NPM_SECRET}:{NPM_SECRET}", "both-parts-when-named"),
]


@pytest.mark.parametrize(("userpass", "expected"), [r[:2] for r in BASIC], ids=[r[2] for r in BASIC])
def test_placeholder_in_basic_credentials_is_decoded_swapped_and_reencoded(
    creds: Creds, userpass: str, expected: str
) -> None:
    out = run(creds, [("Authorization", _basic(userpass))])
    assert out.refusal is None and out.fields is not None
    ((name, value),) = out.fields
    assert name == b"Authorization"
    assert value.startswith(b"Basic ")
    assert _unbasic(value) == expected


def test_basic_scheme_is_matched_case_insensitively_and_kept(creds: Creds) -> None:
    out = run(creds, [("authorization", "basic " + _basic(f"u:{P_GH}").split(" ")[1])])
    assert out.fields is not None
    ((_, value),) = out.fields
    assert value.startswith(b"basic ")
    assert _unbasic(value) == f"u:{GH_SECRET}"


def test_two_credentials_in_two_headers_are_both_swapped(creds: Creds) -> None:
    out = run(creds, [("Authorization", f"Bearer {P_GH}"), ("X-Npm-Token", P_NPM)])  # npm names it
    assert out.fields == [
        (b"Authorization", f"Bearer {GH_SECRET}".encode()),
        (b"X-Npm-Token", NPM_SECRET.encode()),
    ]
    assert out.used == {"github": 1, "npm": 1}


def test_used_reports_the_version_of_each_credential(creds: Creds) -> None:
    assert run(creds, [("X-Api-Key", P_GH)]).used == {"github": 1}
    (creds.dir / "github").write_text("ghs_rotatedToALongerSecretValue2\n")
    out = run(creds, [("X-Api-Key", P_GH)])
    assert out.used == {"github": 2}
    assert out.fields == [(b"X-Api-Key", b"ghs_rotatedToALongerSecretValue2")]


UNTOUCHED = [
    ([("Authorization", f"Bearer {P_UNREG}")], "unregistered-placeholder-shape"),
    ([("Authorization", _basic(f"u:{P_UNREG}"))], "unregistered-in-basic"),
    ([("Authorization", "Basic !!!not-base64!!!")], "invalid-basic-not-a-crash"),
    ([("Authorization", "Bearer ghp_plain")], "no-placeholder"),
    ([("X-Note", P_GH[:-6])], "too-short-to-be-a-placeholder"),
    ([], "no-headers"),
]


@pytest.mark.parametrize("fields", [r[0] for r in UNTOUCHED], ids=[r[1] for r in UNTOUCHED])
@pytest.mark.parametrize("host", ["api.github.com", "evil.example.net"], ids=["bound", "unbound"])
def test_requests_without_registered_placeholders_are_left_alone(
    creds: Creds, fields: list[tuple[str, str]], host: str
) -> None:
    out = run(creds, fields, host=host, target=f"/x?{P_UNREG}")
    assert (out.fields, out.refusal, out.used, out.carried) == (None, None, {}, [])


# --- violations and refusals ----------------------------------------------------------------


def _assert_no_secret(out: Outcome) -> None:
    assert out.refusal is not None
    for secret in ALL_SECRETS:
        assert secret not in out.refusal.message
        assert secret not in repr(out.refusal)
    assert out.fields is None and out.used == {}


VIOLATIONS = [
    ([("Authorization", f"Bearer {P_GH}")], "/", "header Authorization", "bearer-header"),
    ([("X-Api-Key", P_GH)], "/", "header X-Api-Key", "bare-header"),
    ([("Authorization", _basic(f"u:{P_GH}"))], "/", "header Authorization", "basic-credentials"),
    ([], f"/upload/{P_GH}", "request target", "target-path"),
    ([], f"/upload?token={P_GH}", "request target", "target-query"),
    ([("X-Ok", "1")], f"/?a=1&t={P_GH}", "request target", "target-with-other-headers"),
]


@pytest.mark.parametrize(
    ("fields", "target", "where"), [r[:3] for r in VIOLATIONS], ids=[r[3] for r in VIOLATIONS]
)
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "cleartext"])
def test_placeholder_toward_an_unbound_host_is_a_violation(
    creds: Creds, fields: list[tuple[str, str]], target: str, where: str, tls: bool
) -> None:
    out = run(creds, fields, target=target, host="evil.example.net", tls=tls)
    assert out.refusal is not None
    assert (out.refusal.action, out.refusal.reason) == (Action.VIOLATION, Reason.PLACEHOLDER_VIOLATION)
    assert out.refusal.status == 403
    assert "'github'" in out.refusal.message
    assert where in out.refusal.message
    assert "evil.example.net" in out.refusal.message
    _assert_no_secret(out)


def test_violation_is_found_before_any_secret_is_read(creds: Creds) -> None:
    (creds.dir / "github").unlink()
    out = run(creds, [("X-Api-Key", P_GH)], host="evil.example.net")
    assert out.refusal is not None and out.refusal.reason is Reason.PLACEHOLDER_VIOLATION


def test_one_unbound_placeholder_refuses_the_whole_request(creds: Creds) -> None:
    # npm is bound to *.npmjs.org; github is not: nothing may be swapped.
    out = run(creds, [("X-Npm", P_NPM), ("X-Gh", P_GH)], host="registry.npmjs.org")
    assert out.refusal is not None and out.refusal.reason is Reason.PLACEHOLDER_VIOLATION
    _assert_no_secret(out)


@pytest.mark.parametrize(
    "field",
    [("Authorization", f"Bearer {P_GH}"), ("Authorization", _basic(f"u:{P_GH}"))],
    ids=["bearer", "basic"],
)
def test_placeholder_toward_a_bound_host_over_cleartext_is_refused(
    creds: Creds, field: tuple[str, str]
) -> None:
    out = run(creds, [field], tls=False)
    assert out.refusal is not None
    assert (out.refusal.action, out.refusal.reason) == (Action.VIOLATION, Reason.CLEARTEXT_CREDENTIAL)
    assert out.refusal.status == 403
    _assert_no_secret(out)


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "cleartext"])
def test_placeholder_in_the_target_toward_a_bound_host_is_carried_unchanged(creds: Creds, tls: bool) -> None:
    out = run(creds, [("Accept", "*/*")], target=f"/x?token={P_GH}", tls=tls)
    assert (out.fields, out.refusal, out.used) == (None, None, {})
    assert out.carried == ["github"]


def test_unreadable_value_source_refuses_with_credential_unavailable(creds: Creds) -> None:
    (creds.dir / "github").unlink()
    out = run(creds, [("Authorization", f"Bearer {P_GH}")])
    assert out.refusal is not None
    assert (out.refusal.action, out.refusal.reason) == (Action.ERROR, Reason.CREDENTIAL_UNAVAILABLE)
    assert out.refusal.status == 503
    # the sandbox learns which credential, not where the operator keeps it
    assert "'github'" in out.refusal.message and str(creds.dir) not in out.refusal.message
    _assert_no_secret(out)


def test_unreadable_injection_source_refuses_with_credential_unavailable(creds: Creds) -> None:
    (creds.dir / "inj").unlink()
    out = run(creds, [], host="api.example.com", inject=True)
    assert out.refusal is not None and out.refusal.reason is Reason.CREDENTIAL_UNAVAILABLE
    assert out.refusal.status == 503


# --- injections -----------------------------------------------------------------------------

INJECT_SENT = [
    ([], "nothing-sent"),
    ([("Authorization", "Bearer sandbox-made-this-up")], "replaces-same-case"),
    ([("authorization", "Bearer x"), ("AUTHORIZATION", "Basic y")], "replaces-any-case-all"),
]


@pytest.mark.parametrize("sent", [r[0] for r in INJECT_SENT], ids=[r[1] for r in INJECT_SENT])
def test_injection_sets_its_header_toward_a_bound_host_over_tls(
    creds: Creds, sent: list[tuple[str, str]]
) -> None:
    out = run(creds, [("Accept", "*/*"), *sent], host="api.example.com", inject=True)
    assert out.refusal is None
    assert out.fields == [(b"Accept", b"*/*"), (b"Authorization", f"Bearer {INJ_SECRET}".encode())]
    assert out.used == {"inj": 1}


@pytest.mark.parametrize(
    ("host", "tls"),
    [("api.github.com", True), ("api.example.com", False)],
    ids=["unbound-host", "cleartext"],
)
def test_injection_does_nothing_toward_unbound_hosts_or_over_cleartext(
    creds: Creds, host: str, tls: bool
) -> None:
    out = run(creds, [("Authorization", "Bearer sent")], host=host, tls=tls, inject=True)
    assert (out.fields, out.refusal, out.used) == (None, None, {})


def test_injection_and_swap_together(tmp_path: Path) -> None:
    c = _make_creds(tmp_path)
    both = _cred(
        tmp_path,
        "both",
        "surr_BothPlaceholder00000000005",
        ["api.github.com"],
        "both_secretValue",
        Injection("X-Injected", "key={value};"),
    )
    out = substitute_request(
        [(b"X-Api-Key", P_GH.encode())],
        b"/",
        "api.github.com",
        True,
        c.by_placeholder(),
        [both],
    )
    assert out.fields == [(b"X-Api-Key", GH_SECRET.encode()), (b"X-Injected", b"key=both_secretValue;")]
    assert out.used == {"github": 1, "both": 1}


# --- property: a swap is exactly a replacement ----------------------------------------------

_text = st.text(alphabet=" ,;=:/abcXYZ019-", max_size=20)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_text, _text)
def test_swap_replaces_exactly_the_placeholder_and_nothing_else(
    creds: Creds, before: str, after: str
) -> None:
    # A letter/digit right before or after makes a different (longer) run; keep a separator.
    value = f"{before} {P_GH} {after}"
    out = run(creds, [("Authorization", value)])
    assert out.fields == [(b"Authorization", value.replace(P_GH, GH_SECRET).encode())]


@pytest.mark.parametrize(
    ("version", "headers", "bodiless"),
    [
        ("HTTP/1.1", {}, True),  # RFC 9112 §6.3: no length, no coding: length zero
        ("HTTP/1.1", {"content-length": "0"}, True),
        ("HTTP/1.1", {"content-length": " 0 "}, True),
        ("HTTP/1.1", {"content-length": "5"}, False),
        ("HTTP/1.1", {"content-length": "00"}, False),  # unusual: checked rather than trusted
        ("HTTP/1.1", {"transfer-encoding": "chunked"}, False),
        ("HTTP/1.0", {}, True),
        ("HTTP/2.0", {}, False),  # DATA frames may follow any HTTP/2 head, a GET's too
        ("HTTP/2.0", {"content-length": "0"}, True),
    ],
)
def test_a_body_is_skipped_only_when_the_head_rules_one_out(
    version: str, headers: dict[str, str], bodiless: bool
) -> None:
    req = tutils.treq(method=b"GET", http_version=version.encode(), headers=http.Headers(**headers))
    assert _bodiless(req) is bodiless
