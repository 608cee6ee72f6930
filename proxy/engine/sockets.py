"""Is a TCP connection's far end one of this user's own connecting sockets? (loop detection)

With ``--workers N`` a connection the proxy opens upstream and the kernel redirects back to the
transparent port may land on another worker, which never saw it open. The kernel's socket table
(``/proc/net/tcp`` and ``/proc/net/tcp6``, this network namespace's) says who holds the other
end: an established or connecting socket whose local end is the looped connection's source and
whose owner is the proxy's user is the proxy talking to itself. A sandbox that runs as the
proxy's own user would be taken for the proxy and refused, which is the safe reading.

Addresses in the table are hex in host byte order, 32 bits at a time (``proc(5)``).
"""

from __future__ import annotations

import ipaddress
import struct

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_CONNECTING = {"01", "02"}  # TCP_ESTABLISHED, TCP_SYN_SENT (include/net/tcp_states.h)


def _address(text: str) -> tuple[str, int]:
    """("ip", port) of a /proc/net/tcp* ``address:port`` field; IPv4-mapped IPv6 as IPv4."""
    hexip, hexport = text.split(":")
    # each 8-digit word is a 32-bit value printed from memory in host order: pack it back natively
    packed = b"".join(struct.pack("=I", int(hexip[i : i + 8], 16)) for i in range(0, len(hexip), 8))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(hexport, 16)


def held_by(local: tuple[str, int], uid: int) -> bool:
    """True when a connecting TCP socket of user ``uid`` has ``local`` (canonical IP, port) as
    its local end. False when the tables cannot be read (not Linux)."""
    for table in _TABLES:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    mine = len(fields) > 7 and fields[3] in _CONNECTING and int(fields[7]) == uid
                    if mine and _address(fields[1]) == local:
                        return True
        except (OSError, ValueError):
            continue
    return False
