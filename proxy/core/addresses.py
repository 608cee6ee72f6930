"""Special-purpose addresses: an explicit table, not ``ipaddress``'s ``is_global``.

Python's ``is_global``/``is_private`` have changed between versions and count some special
ranges as global (the shared CGNAT block, NAT64, some documentation ranges). surrogate decides
from its own table, from the IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890
and its updates), plus the cloud metadata endpoints that sit in ordinary ranges. IPv4 embedded
in IPv6 (mapped, compatible, NAT64 well-known prefix, 6to4, Teredo) is unwrapped and checked
again, so ``::ffff:169.254.169.254`` is what it is.

:func:`special` returns a short description of why an address is special-purpose, or None for
an ordinary, globally routable unicast address. Pure; no I/O.
"""

from __future__ import annotations

import ipaddress

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Most specific first: the first match names the reason.
_TABLE: tuple[tuple[str, str], ...] = (
    # cloud metadata endpoints (also where they sit inside a wider special range)
    ("169.254.169.254/32", "the cloud metadata endpoint (AWS, GCP, Azure, OpenStack)"),
    ("169.254.170.2/32", "the AWS ECS task metadata endpoint"),
    ("100.100.100.200/32", "the Alibaba Cloud metadata endpoint"),
    ("168.63.129.16/32", "the Azure host (WireServer) endpoint"),
    ("fd00:ec2::254/128", "the AWS IPv6 metadata endpoint"),
    # IPv4 (RFC 6890 §2.2.2 and updates)
    ("0.0.0.0/8", "'this network' (RFC 791)"),
    ("10.0.0.0/8", "a private address (RFC 1918)"),
    ("100.64.0.0/10", "a shared/CGNAT address (RFC 6598)"),
    ("127.0.0.0/8", "a loopback address (RFC 1122)"),
    ("169.254.0.0/16", "a link-local address (RFC 3927)"),
    ("172.16.0.0/12", "a private address (RFC 1918)"),
    ("192.0.0.0/24", "an IETF protocol assignment (RFC 6890)"),
    ("192.0.2.0/24", "a documentation address (RFC 5737)"),
    ("192.31.196.0/24", "an AS112 address (RFC 7535)"),
    ("192.52.193.0/24", "an AMT address (RFC 7450)"),
    ("192.88.99.0/24", "the deprecated 6to4 relay anycast (RFC 7526)"),
    ("192.168.0.0/16", "a private address (RFC 1918)"),
    ("192.175.48.0/24", "an AS112 address (RFC 7534)"),
    ("198.18.0.0/15", "a benchmarking address (RFC 2544)"),
    ("198.51.100.0/24", "a documentation address (RFC 5737)"),
    ("203.0.113.0/24", "a documentation address (RFC 5737)"),
    ("224.0.0.0/4", "a multicast address (RFC 5771)"),
    ("240.0.0.0/4", "a reserved address (RFC 1112)"),
    # IPv6 (RFC 6890 §2.2.3 and updates); embedded IPv4 forms are unwrapped before this table
    ("::/128", "the unspecified address (RFC 4291)"),
    ("::1/128", "the loopback address (RFC 4291)"),
    ("64:ff9b:1::/48", "a local-use NAT64 address (RFC 8215)"),
    ("100::/64", "a discard-only address (RFC 6666)"),
    ("100:0:0:1::/64", "a dummy IPv6 prefix (RFC 9780)"),
    ("2001::/32", "a Teredo address (RFC 4380)"),
    ("2001::/23", "an IETF protocol assignment (RFC 2928)"),
    ("2001:db8::/32", "a documentation address (RFC 3849)"),
    ("2002::/16", "a 6to4 address (RFC 3056, deprecated)"),
    ("2620:4f:8000::/48", "an AS112 address (RFC 7534)"),
    ("3fff::/20", "a documentation address (RFC 9637)"),
    ("5f00::/16", "a segment-routing SID (RFC 9602)"),
    ("fc00::/7", "a unique local address (RFC 4193)"),
    ("fe80::/10", "a link-local address (RFC 4291)"),
    ("fec0::/10", "a deprecated site-local address (RFC 3879)"),
    ("ff00::/8", "a multicast address (RFC 4291)"),
)
_NETWORKS: tuple[tuple[Network, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in _TABLE)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPAT = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo client)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def special(ip: IP) -> str | None:
    """Why ``ip`` is special-purpose, or None for an ordinary global unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None and (why := special(inner)) is not None:
            return f"{why}, embedded in {ip}"
        # a public IPv4 inside is fine for mapped and NAT64 forms; the table below still marks
        # Teredo (in 2001::/23) and 6to4 as special whatever they carry
    for net, why in _NETWORKS:
        if ip.version == net.version and ip in net:
            return why
    if ip.version == 4 and int(ip) == 0xFFFFFFFF:
        return "the broadcast address"
    return None


def allowed_by(ip: IP, networks: tuple[Network, ...]) -> bool:
    """True when ``ip`` (or the IPv4 it embeds) is inside one of the explicitly allowed networks."""
    candidates: list[IP] = [ip]
    if isinstance(ip, ipaddress.IPv6Address) and (inner := embedded_ipv4(ip)) is not None:
        candidates.append(inner)
    return any(c.version == n.version and c in n for c in candidates for n in networks)
