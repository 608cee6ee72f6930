"""The host's own addresses, for the own-listener check (issue 21).

A listener bound to ``0.0.0.0`` or ``::`` accepts connections on every address of the host, not
only on loopback: a request to any of them on a listener's port would loop back into the proxy.
Addresses come and go (DHCP, a new veth, a container's interface), so they are read from the
kernel (``getifaddrs(3)``, through psutil) each time the question is asked — only for a
destination whose port is one of the proxy's own, so the cost (~100 µs) is not on the path of
ordinary requests. A read that fails counts every address as the host's (fail closed).
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_addresses() -> frozenset[IP] | None:
    """Every IPv4 and IPv6 address on this host's interfaces (in this network namespace),
    IPv6 zone ids dropped; None when they cannot be read."""
    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return None
    found: set[IP] = set()
    for addresses in interfaces.values():
        for a in addresses:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    found.add(ipaddress.ip_address(a.address.split("%", 1)[0]))
                except ValueError:
                    continue
    return frozenset(found)


def is_own_address(ip: IP) -> bool:
    """True when ``ip`` reaches this host: loopback, unspecified, or one of its addresses."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    mine = host_addresses()
    return mine is None or ip in mine
