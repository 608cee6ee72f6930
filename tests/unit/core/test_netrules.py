"""`surrogate transparent-rules`: the printed fence (redirect TCP, drop the rest, both families).

Every printed set is also loaded for real into iptables, ip6tables, ebtables and nft and probed
from network namespaces in tests/e2e/test_fence.py; these tests pin the text."""

from __future__ import annotations

import pytest

from proxy.core.netrules import interface_mark, transparent_rules


def test_interface_rules() -> None:
    out = transparent_rules(8081, interface="veth-sbx")
    assert "iptables -t nat -A PREROUTING -i veth-sbx -p tcp -j REDIRECT --to-ports 8081" in out
    assert 'iifname "veth-sbx" meta l4proto tcp redirect to :8081' in out


FORMS = {
    "interface": ({"interface": "veth-sbx"}, "-i veth-sbx", 'iifname "veth-sbx"'),
    "source": (
        {"source": ["10.0.0.7/32", "fd00::7/128"], "unsafe_source_only": True},
        "-s 10.0.0.7/32",
        "ip saddr 10.0.0.7/32",
    ),
    "uid": ({"uid": 1001, "proxy_uid": 999}, "--uid-owner 1001", "meta skuid 1001"),
}


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_every_form_redirects_tcp_and_drops_the_rest_in_both_families(form: str) -> None:
    kwargs, ipt, nft = FORMS[form]
    out = transparent_rules(8081, **kwargs)  # type: ignore[arg-type]
    lines = out.splitlines()
    for cmd in ("iptables", "ip6tables"):
        mine = [line for line in lines if line.startswith(cmd + " ")]
        assert any("-t nat" in line and "-p tcp -j REDIRECT --to-ports 8081" in line for line in mine), cmd
        drops = [line for line in mine if line.endswith("-j DROP")]
        chains = {"OUTPUT"} if form == "uid" else {"INPUT", "FORWARD"}
        assert {line.split()[4] for line in drops} == chains, cmd
        # the DROP of each chain comes after (below) that chain's accepts
        assert all(ipt in line or "-s fd00::7/128" in line for line in drops), cmd
    nft_text = out[out.index("table inet surrogate") :]
    assert nft_text.count("redirect to :8081") == 2  # ipv4 and ipv6
    assert "drop" in nft_text and nft in nft_text
    assert "priority dstnat" not in nft_text or form != "uid"  # nft 1.0.6 refuses dstnat in output


def test_uid_rules_exclude_the_proxy_user() -> None:
    out = transparent_rules(8081, uid=1001, proxy_uid=999)
    assert "-m owner --uid-owner 1001 -m owner ! --uid-owner 999 -p tcp -j REDIRECT --to-ports 8081" in out
    assert "meta skuid 1001 meta skuid != 999" in out
    assert "type nat hook output priority -100;" in out


def test_no_ipv6_listener_drops_all_ipv6() -> None:
    out = transparent_rules(8081, interface="veth0", ipv6=False)
    v6 = [line for line in out.splitlines() if line.startswith("ip6tables -t filter")]
    assert v6 == [
        "ip6tables -t filter -I INPUT 1 -i veth0 -j DROP",
        "ip6tables -t filter -I FORWARD 1 -i veth0 -j DROP",
    ]
    assert out.count("redirect to :8081") == 1 and "ip6tables -t nat" not in out


def test_a_named_resolver_is_the_only_dns_let_through() -> None:
    out = transparent_rules(8081, interface="veth0", resolvers=["10.0.0.53"])
    assert "iptables -t nat -A PREROUTING -i veth0 -d 10.0.0.53 -p tcp --dport 53 -j RETURN" in out
    assert "iptables -t filter -I FORWARD 1 -i veth0 -d 10.0.0.53 -p udp --dport 53 -j ACCEPT" in out
    assert "ip daddr 10.0.0.53 meta l4proto { udp, tcp } th dport 53 accept" in out
    assert "-d 10.0.0.53" not in "\n".join(line for line in out.splitlines() if line.startswith("ip6tables"))


def test_interface_with_sources_prints_the_anti_spoof_rule() -> None:
    out = transparent_rules(8081, interface="veth0", source=["10.0.0.2/32", "fd00::2/128"])
    assert "iptables -t raw -I PREROUTING 1 -i veth0 -s 10.0.0.2/32 -j RETURN" in out
    assert "iptables -t raw -I PREROUTING 2 -i veth0 -j DROP" in out
    assert 'iifname "veth0" meta nfproto ipv4 ip saddr != 10.0.0.2/32 drop' in out
    assert "ip6 saddr != { fd00::2/128, fe80::/10 } drop" in out


def test_bridge_port_rules_drop_other_sources_and_mark_the_port() -> None:
    out = transparent_rules(8081, bridge_port="sg-a", source=["10.0.0.2/32"])
    mark = f"{interface_mark('sg-a'):#010x}"
    assert (
        f"ebtables -t nat -A PREROUTING -i sg-a -p IPv4 --ip-src 10.0.0.2/32 -j mark --mark-set {mark}" in out
    )
    assert "ebtables -t nat -A PREROUTING -i sg-a -j DROP" in out  # every other frame, any ethertype
    assert 'iifname "sg-a" drop' in out
    assert "sysctl -w net.ipv4.tcp_fwmark_accept=1" in out


def test_interface_marks_are_stable_and_distinct() -> None:
    assert interface_mark("sg-a") == interface_mark("sg-a") and interface_mark("sg-a") != interface_mark(
        "sg-b"
    )
    assert interface_mark("x") & 0x80000000


def test_source_form_says_which_family_is_not_fenced() -> None:
    out = transparent_rules(1, source="10.0.0.7/24", unsafe_source_only=True)
    assert "iptables -t nat -A PREROUTING -s 10.0.0.0/24 -p tcp" in out
    assert "IPv6: no --source of this family was given; its traffic is NOT fenced" in out
    v6 = transparent_rules(1, source="fd00::1/64", unsafe_source_only=True)
    assert "ip6tables -t nat -A PREROUTING -s fd00::/64" in v6
    assert "ip6 saddr fd00::/64" in v6


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"uid": 1001}, "--proxy-uid"),
        ({"uid": 5, "proxy_uid": 5}, "differ"),
        ({}, "exactly one"),
        ({"interface": "a", "uid": 3, "proxy_uid": 4}, "exactly one"),
        ({"interface": "eth0; rm -rf /"}, "not an interface name"),
        ({"source": "not-an-ip"}, "does not appear to be"),
        ({"interface": "a", "resolvers": ["dns.example"]}, "not an IP address"),
        ({"bridge_port": "a"}, "needs --source"),
        ({"bridge_port": "a", "interface": "b", "source": "10.0.0.1"}, "only --source"),
        ({"source": "10.0.0.7/32"}, "--unsafe-source-only"),
        ({"source": ["10.0.0.7/32", "fd00::7/128"]}, "--unsafe-source-only"),
    ],
    ids=[
        "uid-without-proxy-uid",
        "same-uid",
        "none",
        "two",
        "shell-injection",
        "bad-source",
        "bad-resolver",
        "bridge-no-source",
        "bridge-and-interface",
        "source-alone-v4",
        "source-alone-both",
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        transparent_rules(8081, **kwargs)


def test_the_interface_form_marks_what_arrives_there_unless_a_port_marked_it() -> None:
    out = transparent_rules(8081, interface="veth0")
    mark = f"{interface_mark('veth0'):#010x}"
    assert f"iptables -t mangle -A PREROUTING -i veth0 -m mark --mark 0 -j MARK --set-mark {mark}" in out
    assert f"ip6tables -t mangle -A PREROUTING -i veth0 -m mark --mark 0 -j MARK --set-mark {mark}" in out
    assert f'iifname "veth0" meta mark 0 meta mark set {mark}' in out
    assert "sysctl -w net.ipv4.tcp_fwmark_accept=1" in out


def test_source_alone_is_marked_unsafe_when_asked_for() -> None:
    """Review r3: the --source form matches only the addresses named, so a sandbox that takes
    another address is not fenced at all (tests/e2e/test_fence_escapes.py); it is printed only on
    request, and says so."""
    out = transparent_rules(1, source="10.0.0.7/32", unsafe_source_only=True)
    assert "UNSAFE: a sandbox that changes its source address is matched by none of these rules" in out


def test_a_bridge_port_bridges_nothing_to_another_port() -> None:
    """Review r3: without br_netfilter, bridged frames never meet the host's IP fence; the port's
    own rules drop every frame forwarded from it (ebtables FORWARD, an nft bridge forward hook)."""
    out = transparent_rules(8081, bridge_port="sg-a", source=["10.0.0.2/32", "fd00::2/128"])
    assert "ebtables -t filter -A FORWARD -i sg-a -j DROP" in out
    bridge = out[out.index("table bridge surrogate") :]
    forward = bridge[bridge.index("hook forward") :]
    assert 'iifname "sg-a" drop' in forward.splitlines()[1]


def test_a_bridge_ports_neighbour_advertisements_name_only_its_own_addresses() -> None:
    """Review r3: an NA's target is what the host's neighbour table learns; the nft port rules
    let one through only when the target is in the sandbox's own IPv6 networks (raw payload:
    the 16 bytes at transport offset 64 bits), checked before the source-address accept."""
    out = transparent_rules(8081, bridge_port="sg-a", source=["10.0.0.2/32", "fd00:1::/64"])
    bridge = out[out.index("table bridge surrogate") :]
    mark = f"{interface_mark('sg-a'):08x}"
    assert (
        "    @th,64,128 & 0xffffffffffffffff0000000000000000 == 0xfd000001000000000000000000000000 return\n"
        '    iifname "sg-a" drop\n'
    ) in bridge
    jump = f'iifname "sg-a" icmpv6 type nd-neighbor-advert jump nd_{mark}'
    assert bridge.index(jump) < bridge.index("ip6 saddr")
    v4_only = transparent_rules(8081, bridge_port="sg-a", source=["10.0.0.2/32"])
    assert "return" not in v4_only  # no IPv6 of its own: every advertisement from the port is dropped
