"""proxy.core.hosts: one canonical form for host names, and egress host patterns matched against it."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.errors import HostError
from proxy.core.hosts import HostPattern, canonical_host, split_authority

# --- canonical_host -------------------------------------------------------------------------

CANONICAL = [
    ("api.github.com", "api.github.com", "already-canonical"),
    ("API.GitHub.COM", "api.github.com", "upper-case-lowered"),
    ("api.github.com.", "api.github.com", "trailing-dot-dropped"),
    ("  api.github.com  ", "api.github.com", "surrounding-whitespace-stripped"),
    ("BÜCHER.example", "xn--bcher-kva.example", "idna-u-label-to-a-label"),
    ("bücher.example.", "xn--bcher-kva.example", "idna-with-trailing-dot"),
    ("xn--bcher-kva.example", "xn--bcher-kva.example", "a-label-unchanged"),
    ("XN--BCHER-KVA.EXAMPLE", "xn--bcher-kva.example", "a-label-upper-case-lowered"),
    ("ｅｘａｍｐｌｅ.com", "example.com", "uts46-fullwidth-mapped"),
    ("_dmarc.example.com", "_dmarc.example.com", "underscore-tolerated"),
    ("127.0.0.1", "127.0.0.1", "ipv4-literal"),
    ("::1", "::1", "ipv6-literal"),
    ("[::1]", "::1", "ipv6-brackets-removed"),
    ("0:0:0:0:0:0:0:1", "::1", "ipv6-compressed"),
    ("[2001:DB8::1]", "2001:db8::1", "ipv6-upper-case-lowered"),
    ("127.1", "127.0.0.1", "ipv4-short-form"),
    ("127.0.1", "127.0.0.1", "ipv4-three-parts"),
    ("2130706433", "127.0.0.1", "ipv4-decimal"),
    ("0x7f000001", "127.0.0.1", "ipv4-hex"),
    ("0X7F.0.0.1", "127.0.0.1", "ipv4-hex-part-upper"),
    ("0177.0.0.1", "127.0.0.1", "ipv4-octal-part"),
    ("017700000001", "127.0.0.1", "ipv4-octal"),
    ("127.000.000.001", "127.0.0.1", "ipv4-zero-padded-octal"),
    ("127.0.0.1.", "127.0.0.1", "ipv4-trailing-dot"),
    ("169.254.43518", "169.254.169.254", "ipv4-two-parts"),
    ("0", "0.0.0.0", "ipv4-zero"),
    ("1.2.3.4.5", "1.2.3.4.5", "five-numeric-labels-is-a-name"),
    ("08.1.1.1", "08.1.1.1", "not-octal-is-a-name"),
]


@pytest.mark.parametrize(("raw", "expected"), [r[:2] for r in CANONICAL], ids=[r[2] for r in CANONICAL])
def test_canonical_host_returns_the_canonical_form(raw: str, expected: str) -> None:
    assert canonical_host(raw) == expected


def test_canonical_host_unicode_and_a_label_spellings_are_the_same_host() -> None:
    assert canonical_host("BÜCHER.example") == canonical_host("xn--bcher-kva.example")


INVALID = [
    ("", "empty"),
    ("   ", "only-whitespace"),
    ("[]", "empty-brackets"),
    (".", "only-a-dot"),
    ("a..example.com", "empty-label-inside"),
    (".example.com", "empty-label-leading"),
    ("example.com..", "empty-label-two-trailing-dots"),
    ("exa mple.com", "space-inside"),
    ("example.com:443", "port-attached"),
    ("example.com/path", "slash"),
    ("*.example.com", "wildcard-is-not-a-host"),
    ("a" * 250 + ".com", "longer-than-253"),
    ("☃.com", "idna-disallowed-codepoint"),
    ("bü_cher.example", "idna-underscore-in-u-label"),
    ("256.1.1.1", "ipv4-part-out-of-range"),
    ("1.2.65536", "ipv4-last-part-out-of-range"),
    ("4294967296", "ipv4-decimal-out-of-range"),
]


@pytest.mark.parametrize("raw", [r[0] for r in INVALID], ids=[r[1] for r in INVALID])
def test_canonical_host_refuses_invalid_names_with_host_error_naming_the_value(raw: str) -> None:
    with pytest.raises(HostError) as info:
        canonical_host(raw)
    assert repr(raw) in str(info.value)


_LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?\Z")
# the last label starts with a letter: all-numeric names are IPv4 spellings (tested above)
_TLD = st.from_regex(r"\A[a-z]([a-z0-9-]{0,10}[a-z0-9])?\Z")
_NAMES = st.builds(lambda labels, tld: ".".join([*labels, tld]), st.lists(_LABEL, max_size=4), _TLD)


@given(_NAMES)
def test_canonical_host_is_idempotent(name: str) -> None:
    once = canonical_host(name)
    assert canonical_host(once) == once


@given(_NAMES, st.booleans())
def test_canonical_host_ignores_case_and_one_trailing_dot(name: str, dot: bool) -> None:
    spelled = name.upper() + ("." if dot else "")
    assert canonical_host(spelled) == canonical_host(name)


# --- HostPattern.parse ----------------------------------------------------------------------

PARSE = [
    ("api.github.com", "api.github.com", None, False, "exact"),
    ("API.GitHub.com.", "api.github.com", None, False, "exact-canonicalised"),
    ("*.example.com", "*.example.com", ".example.com", False, "wildcard"),
    ("*.Example.COM", "*.example.com", ".example.com", False, "wildcard-canonicalised"),
    ("*.BÜCHER.example", "*.xn--bcher-kva.example", ".xn--bcher-kva.example", False, "wildcard-idna"),
    ("*", "*", None, True, "any-host"),
    (" * ", "*", None, True, "any-host-whitespace-stripped"),
    ("[::1]", "::1", None, False, "ipv6-literal"),
]


@pytest.mark.parametrize(
    ("raw", "text", "suffix", "any_host"), [r[:4] for r in PARSE], ids=[r[4] for r in PARSE]
)
def test_host_pattern_parse_compiles_to_canonical_spelling(
    raw: str, text: str, suffix: str | None, any_host: bool
) -> None:
    pattern = HostPattern.parse(raw)
    assert (pattern.text, pattern.suffix, pattern.any_host) == (text, suffix, any_host)
    assert str(pattern) == text


BAD_PATTERNS = [
    ("a.*.com", "star-in-middle-label"),
    ("*foo.com", "star-not-whole-label"),
    ("foo*.com", "star-at-label-end"),
    ("api.*", "star-as-last-label"),
    ("**.com", "double-star"),
    ("*.*.com", "two-star-labels"),
    ("*.", "star-without-base"),
    ("", "empty"),
    ("*.a..com", "wildcard-base-with-empty-label"),
    ("exa mple.com", "invalid-exact-name"),
]


@pytest.mark.parametrize("raw", [r[0] for r in BAD_PATTERNS], ids=[r[1] for r in BAD_PATTERNS])
def test_host_pattern_parse_refuses_misplaced_star_and_invalid_names(raw: str) -> None:
    with pytest.raises(HostError):
        HostPattern.parse(raw)


# --- HostPattern.matches --------------------------------------------------------------------

MATCHES = [
    ("api.github.com", "api.github.com", True, "exact-same"),
    ("api.github.com", "github.com", False, "exact-not-parent"),
    ("api.github.com", "x.api.github.com", False, "exact-not-child"),
    ("*.example.com", "a.example.com", True, "wildcard-one-label"),
    ("*.example.com", "a.b.example.com", True, "wildcard-several-labels"),
    ("*.example.com", "example.com", False, "wildcard-never-bare-apex"),
    ("*.example.com", "badexample.com", False, "wildcard-only-at-label-boundary"),
    ("*.example.com", "a.badexample.com", False, "wildcard-label-boundary-deeper"),
    ("*.example.com", "example.com.evil.net", False, "wildcard-suffix-not-infix"),
    ("*.example.com", ".example.com", False, "wildcard-needs-non-empty-label"),
    ("*", "anything.example", True, "any-host-name"),
    ("*", "10.0.0.1", True, "any-host-ip"),
    ("::1", "::1", True, "ipv6-literal"),
]


@pytest.mark.parametrize(
    ("pattern", "host", "expected"), [r[:3] for r in MATCHES], ids=[r[3] for r in MATCHES]
)
def test_host_pattern_matches_canonical_host(pattern: str, host: str, expected: bool) -> None:
    assert HostPattern.parse(pattern).matches(host) is expected


# Labels chosen to collide: "a" vs "ba" exercises the label boundary.
_PLABELS = st.lists(st.sampled_from(["a", "b", "ab", "ba"]), min_size=1, max_size=4)


@st.composite
def _patterns(draw: st.DrawFn) -> HostPattern:
    kind = draw(st.sampled_from(["any", "exact", "wildcard"]))
    if kind == "any":
        return HostPattern.parse("*")
    name = ".".join(draw(_PLABELS))
    return HostPattern.parse(name if kind == "exact" else f"*.{name}")


@given(_patterns(), _PLABELS)
def test_host_pattern_matches_agrees_with_a_label_wise_oracle(
    pattern: HostPattern, labels: list[str]
) -> None:
    host = ".".join(labels)
    if pattern.any_host:
        expected = True
    elif pattern.suffix is None:
        expected = host == pattern.text
    else:
        base = pattern.suffix[1:].split(".")
        expected = len(labels) > len(base) and labels[-len(base) :] == base
    assert pattern.matches(host) is expected


# --- HostPattern.covers ---------------------------------------------------------------------

COVERS = [
    ("*", "*", True, "any-covers-any"),
    ("*", "*.example.com", True, "any-covers-wildcard"),
    ("*", "api.example.com", True, "any-covers-exact"),
    ("*.example.com", "*", False, "wildcard-not-covers-any"),
    ("api.example.com", "*", False, "exact-not-covers-any"),
    ("api.example.com", "api.example.com", True, "exact-covers-same"),
    ("api.example.com", "www.example.com", False, "exact-not-covers-other"),
    ("api.example.com", "*.api.example.com", False, "exact-not-covers-wildcard"),
    ("*.example.com", "api.example.com", True, "wildcard-covers-child"),
    ("*.example.com", "a.b.example.com", True, "wildcard-covers-grandchild"),
    ("*.example.com", "example.com", False, "wildcard-not-covers-apex"),
    ("*.example.com", "*.example.com", True, "wildcard-covers-same"),
    ("*.example.com", "*.api.example.com", True, "wildcard-covers-narrower-wildcard"),
    ("*.api.example.com", "*.example.com", False, "wildcard-not-covers-wider-wildcard"),
    ("*.example.com", "*.badexample.com", False, "wildcard-covers-at-label-boundary"),
]


@pytest.mark.parametrize(("outer", "inner", "expected"), [r[:3] for r in COVERS], ids=[r[3] for r in COVERS])
def test_host_pattern_covers_when_every_host_of_the_other_matches(
    outer: str, inner: str, expected: bool
) -> None:
    assert HostPattern.parse(outer).covers(HostPattern.parse(inner)) is expected


def _witness(pattern: HostPattern) -> str:
    """A host matched by ``pattern`` that no other pattern over the test labels singles out."""
    if pattern.any_host:
        return "zz.zz"
    if pattern.suffix is not None:
        return "zz" + pattern.suffix
    return pattern.text


@given(_patterns(), _patterns(), _PLABELS)
def test_host_pattern_covers_is_sound_and_complete(
    outer: HostPattern, inner: HostPattern, labels: list[str]
) -> None:
    host = ".".join(labels)
    if outer.covers(inner) and inner.matches(host):
        assert outer.matches(host)
    assert outer.covers(inner) is outer.matches(_witness(inner))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("API.test", ("api.test", None)),
        ("api.test:8443", ("api.test", 8443)),
        ("[::1]:443", ("::1", 443)),
        ("[::1]", ("::1", None)),
        ("api.test.:443", ("api.test", 443)),
    ],
)
def test_split_authority(value: str, expected: tuple[str, int | None]) -> None:
    assert split_authority(value) == expected


@pytest.mark.parametrize(
    "value", ["api.test:²", "api.test:" + "1" * 5000, "api.test:0", "api.test:65536", "api.test:x", "a..b:1"]
)
def test_split_authority_refuses_bad_ports_and_names(value: str) -> None:
    with pytest.raises(HostError):
        split_authority(value)


# --- numeric IPv4 spellings, cross-checked with the C library's inet_aton --------------------


@st.composite
def _ipv4_spelling(draw: st.DrawFn) -> tuple[str, str]:
    """(a random spelling of a random IPv4 address in 1-4 decimal/octal/hex parts, its dotted quad)."""
    ip = draw(st.ip_addresses(v=4))
    count = draw(st.integers(1, 4))
    raw = int(ip).to_bytes(4, "big")
    parts = [*raw[: count - 1], int.from_bytes(raw[count - 1 :], "big")]
    spelled = []
    for part in parts:
        base, pad = draw(st.sampled_from(["dec", "oct", "hex", "HEX"])), "0" * draw(st.integers(0, 2))
        spelled.append(
            str(part)
            if base == "dec"
            else "0" + pad + format(part, "o")
            if base == "oct"
            else "0x" + pad + format(part, "x")
            if base == "hex"
            else "0X" + pad + format(part, "X")
        )
    return ".".join(spelled), str(ip)


@given(_ipv4_spelling(), st.booleans())
def test_every_numeric_spelling_of_an_ipv4_is_its_dotted_quad(case: tuple[str, str], dot: bool) -> None:
    spelling, quad = case
    assert socket.inet_ntoa(socket.inet_aton(spelling)) == quad  # the generator agrees with libc
    assert canonical_host(spelling + ("." if dot else "")) == quad


def _is_ipv4(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 4
    except ValueError:
        return False


@given(
    st.lists(st.from_regex(r"\A(0[xX][0-9a-fA-F]{0,9}|[0-9]{1,11})\Z"), min_size=1, max_size=5).map(".".join)
)
def test_numeric_names_agree_with_inet_aton(host: str) -> None:
    """What libc (so getaddrinfo, so a connect) reads as an IPv4 address, canonical_host reads as
    the same address; what libc refuses is refused or stays a DNS name, never another address."""
    try:
        expected: str | None = socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        expected = None
    try:
        got: str | None = canonical_host(host)
    except HostError:
        got = None
    if expected is not None:
        assert got == expected
    else:
        assert got is None or not _is_ipv4(got)


@given(_NAMES, _NAMES, st.booleans())
def test_wildcard_matching_ignores_case_and_trailing_dot_but_never_takes_the_apex(
    sub: str, base: str, dot: bool
) -> None:
    pattern = HostPattern.parse(f"*.{base}")
    tail = "." if dot else ""
    assert pattern.matches(canonical_host(f"{sub}.{base}".upper() + tail))
    assert not pattern.matches(canonical_host(base.upper() + tail))
    assert not pattern.matches(canonical_host(f"x{base}".upper() + tail))
