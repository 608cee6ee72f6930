"""The special-purpose address table, cross-checked against known spellings."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.addresses import allowed_by, embedded_ipv4, special

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
