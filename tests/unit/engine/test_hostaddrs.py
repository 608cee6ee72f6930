"""proxy.engine.hostaddrs: which addresses reach this host (the own-listener check's notion of "local")."""

from __future__ import annotations

import ipaddress

import pytest

from proxy.engine import hostaddrs


def test_the_host_addresses_hold_loopback_of_both_families() -> None:
    found = hostaddrs.host_addresses()
    assert found is not None and ipaddress.ip_address("127.0.0.1") in found


@pytest.mark.parametrize(
    ("address", "own"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("0.0.0.0", True),
        ("::", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.77", False),
        ("2001:db8::77", False),
    ],
)
def test_is_own_address(address: str, own: bool) -> None:
    assert hostaddrs.is_own_address(ipaddress.ip_address(address)) is own


def test_an_address_of_an_interface_is_own_and_a_failed_read_fails_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra = ipaddress.ip_address("198.51.100.9")
    monkeypatch.setattr(hostaddrs, "host_addresses", lambda: frozenset({extra}))
    assert hostaddrs.is_own_address(extra)
    monkeypatch.setattr(hostaddrs, "host_addresses", lambda: None)
    assert hostaddrs.is_own_address(ipaddress.ip_address("192.0.2.1"))
