"""`surrogate transparent-rules`: the printed iptables and nftables rules."""

from __future__ import annotations

import pytest

from proxy.netrules import transparent_rules


def test_interface_rules() -> None:
    out = transparent_rules(8081, interface="veth-sbx")
    assert "iptables -t nat -A PREROUTING -i veth-sbx -p tcp -j REDIRECT --to-ports 8081" in out
    assert 'iifname "veth-sbx" meta l4proto tcp redirect to :8081' in out


def test_source_rules_v4_and_v6() -> None:
    assert "iptables -t nat -A PREROUTING -s 10.0.0.0/24 -p tcp" in transparent_rules(1, source="10.0.0.7/24")
    assert "ip6tables -t nat -A PREROUTING -s fd00::/64" in transparent_rules(1, source="fd00::1/64")
    assert "ip6 saddr fd00::/64" in transparent_rules(1, source="fd00::1/64")


def test_uid_rules_exclude_the_proxy_user() -> None:
    out = transparent_rules(8081, uid=1001, proxy_uid=999)
    assert "-m owner --uid-owner 1001 -m owner ! --uid-owner 999 -j REDIRECT --to-ports 8081" in out
    assert "meta skuid 1001 meta skuid != 999" in out


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"uid": 1001}, "--proxy-uid"),
        ({"uid": 5, "proxy_uid": 5}, "differ"),
        ({}, "exactly one"),
        ({"interface": "a", "source": "10.0.0.1"}, "exactly one"),
        ({"interface": "eth0; rm -rf /"}, "not an interface name"),
        ({"source": "not-an-ip"}, "does not appear to be"),
    ],
    ids=["uid-without-proxy-uid", "same-uid", "none", "two", "shell-injection", "bad-source"],
)
def test_bad_arguments_are_refused(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        transparent_rules(8081, **kwargs)
