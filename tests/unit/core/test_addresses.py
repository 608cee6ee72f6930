"""The special-purpose address table, cross-checked against known spellings."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.addresses import allowed_by, embedded_ipv4, special
from proxy.core.hosts import canonical_host

SPECIAL = [
    ("169.254.169.254", "metadata"),
    ("169.254.170.2", "ECS"),
    ("100.100.100.200", "Alibaba"),
    ("168.63.129.16", "Azure"),
    ("fd00:ec2::254", "AWS IPv6"),
    ("10.1.2.3", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "CGNAT"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("0.0.0.0", "this network"),
    ("169.254.1.1", "link-local"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("fe80::1", "link-local"),
    ("fc00::1", "unique local"),
    ("fd12:3456::1", "unique local"),
    ("ff02::1", "multicast"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("100::1", "discard"),
    ("64:ff9b:1::1", "local-use NAT64"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "metadata"),
    ("::127.0.0.1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "metadata"),
    ("64:ff9b::7f00:1", "loopback"),
    ("2002:7f00:1::1", "loopback"),
    ("2002:0808:0808::1", "6to4"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "embedded"),
    ("2001:0:4136:e378:8000:63bf:7f7f:7f7f", "Teredo"),
]


@pytest.mark.parametrize(("address", "says"), SPECIAL, ids=[a for a, _ in SPECIAL])
def test_special_purpose_addresses_are_named(address: str, says: str) -> None:
    why = special(ipaddress.ip_address(address))
    assert why is not None and says.lower() in why.lower()


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "140.82.112.3",
        "2606:4700::1111",
        "2a00:1450:4001::200e",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ],
)
def test_ordinary_global_addresses_are_not_special(address: str) -> None:
    assert special(ipaddress.ip_address(address)) is None


def test_embedded_ipv4_forms() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("::ffff:1.2.3.4")) == ipaddress.IPv4Address("1.2.3.4")
    assert embedded_ipv4(ipaddress.IPv6Address("64:ff9b::102:304")) == ipaddress.IPv4Address("1.2.3.4")
    assert embedded_ipv4(ipaddress.IPv6Address("2002:102:304::")) == ipaddress.IPv4Address("1.2.3.4")
    assert embedded_ipv4(ipaddress.IPv6Address("2606:4700::1111")) is None


def test_allow_cidrs_cover_embedded_forms_too() -> None:
    nets = (ipaddress.ip_network("10.0.0.0/8"),)
    assert allowed_by(ipaddress.ip_address("10.2.3.4"), nets)
    assert allowed_by(ipaddress.ip_address("::ffff:10.2.3.4"), nets)
    assert not allowed_by(ipaddress.ip_address("11.0.0.1"), nets)


@given(st.ip_addresses(v=4))
def test_every_ipv4_reads_the_same_mapped_into_ipv6(ip: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}")
    assert (special(ip) is None) == (special(mapped) is None)


@given(st.ip_addresses(v=4))
def test_special_agrees_with_ipaddress_where_python_is_sure(ip: ipaddress.IPv4Address) -> None:
    if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved:
        assert special(ip) is not None


# --- cross-check against an independent copy of the IANA registries ---------------------------
# Written from the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and updates,
# as published 2025), plus multicast and the deprecated site-local block, independently of
# proxy/core/addresses.py. Every entry is refused, whatever its "globally reachable" column says: the
# reachable ones (AS112, AMT, TURN anycast...) are infrastructure no sandbox needs.
IANA_V4 = [
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32", "192.0.0.9/32", "192.0.0.10/32",
    "192.0.0.170/32", "192.0.0.171/32", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
    "192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32",
    "224.0.0.0/4",  # multicast (RFC 5771), not in the special-purpose registry
]  # fmt: skip
IANA_V6 = [
    "::1/128", "::/128", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64", "2001::/23", "2001::/32",
    "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:2::/48", "2001:3::/32",
    "2001:4:112::/48", "2001:10::/28", "2001:20::/28", "2001:30::/28", "2001:db8::/32", "2002::/16",
    "2620:4f:8000::/48", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10",
    "ff00::/8", "fec0::/10",  # multicast (RFC 4291), deprecated site-local (RFC 3879)
]  # fmt: skip
# IPv4 carried in IPv6: judged by the IPv4 inside (the registry's ::ffff:0:0/96 and 64:ff9b::/96,
# and the deprecated compatible form)
EMBEDDING = ["::ffff:0:0/96", "64:ff9b::/96", "::/96"]
METADATA = ["169.254.169.254", "169.254.170.2", "100.100.100.200", "168.63.129.16", "fd00:ec2::254"]
_V4 = [ipaddress.ip_network(n) for n in IANA_V4]
_V6 = [ipaddress.ip_network(n) for n in IANA_V6]
_EMBED = [ipaddress.ip_network(n) for n in EMBEDDING]


def oracle(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Special-purpose, by the independent table."""
    if str(ip) in METADATA:
        return True
    if isinstance(ip, ipaddress.IPv4Address):
        return any(ip in n for n in _V4)
    if any(ip in n for n in _V6):
        return True
    if any(ip in n for n in _EMBED):
        return ip != ipaddress.IPv6Address("::1") and oracle(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return False


@pytest.mark.parametrize("network", IANA_V4 + IANA_V6)
def test_every_registry_range_is_special_at_both_ends(network: str) -> None:
    net = ipaddress.ip_network(network)
    assert special(net.network_address) is not None
    assert special(net.broadcast_address) is not None


@given(st.ip_addresses(v=4) | st.ip_addresses(v=6))
def test_special_agrees_with_the_independent_registry_table(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    assert (special(ip) is not None) is oracle(ip)


@st.composite
def _inside(draw: st.DrawFn) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    net = ipaddress.ip_network(draw(st.sampled_from(IANA_V4 + IANA_V6)))
    return net.network_address + draw(st.integers(0, net.num_addresses - 1))  # type: ignore[return-value]


@given(_inside())
def test_any_address_inside_a_registry_range_is_special(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    assert special(ip) is not None


@given(_inside().filter(lambda ip: ip.version == 4))
def test_a_special_ipv4_stays_special_in_every_ipv6_wrapping(ip: ipaddress.IPv4Address) -> None:
    n = int(ip)
    for wrapped in (
        ipaddress.IPv6Address((0xFFFF << 32) | n),  # ::ffff:a.b.c.d
        ipaddress.IPv6Address((0x64FF9B << 96) | n),  # 64:ff9b::a.b.c.d
        ipaddress.IPv6Address((0x2002 << 112) | (n << 80)),  # 6to4
        ipaddress.IPv6Address((0x20010000 << 96) | (n ^ 0xFFFFFFFF)),  # Teredo client (inverted)
    ):
        assert special(wrapped) is not None, wrapped


# --- known spellings: canonical_host, then the classifier -------------------------------------
KNOWN_SPELLINGS = [
    ("127.0.0.1", "loopback"), ("127.1", "loopback"), ("127.0.1", "loopback"), ("2130706433", "loopback"),
    ("0x7f000001", "loopback"), ("0X7F.0.0.1", "loopback"), ("0177.0.0.1", "loopback"),
    ("017700000001", "loopback"), ("127.000.000.001", "loopback"), ("127.0.0.1.", "loopback"),
    ("[::1]", "loopback"), ("0:0:0:0:0:0:0:1", "loopback"), ("[::ffff:127.0.0.1]", "loopback"),
    ("::ffff:7f00:1", "loopback"), ("[::127.0.0.1]", "loopback"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:7f00:1::1", "loopback"), ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),
    ("0", "this network"), ("0.0.0.0", "this network"), ("[::]", "unspecified"),
    ("169.254.169.254", "metadata"), ("2852039166", "metadata"), ("0xa9fea9fe", "metadata"),
    ("169.254.43518", "metadata"), ("0251.0376.0251.0376", "metadata"), ("[::ffff:a9fe:a9fe]", "metadata"),
    ("[fd00:ec2::254]", "metadata"), ("100.100.100.200", "Alibaba"), ("10.1", "private"),
    ("0xc0a80001", "private"), ("100.64.1", "CGNAT"),
]  # fmt: skip


@pytest.mark.parametrize(("spelling", "says"), KNOWN_SPELLINGS, ids=[s for s, _ in KNOWN_SPELLINGS])
def test_known_spellings_canonicalise_to_a_special_address(spelling: str, says: str) -> None:
    why = special(ipaddress.ip_address(canonical_host(spelling)))
    assert why is not None and says.lower() in why.lower(), why
