"""``surrogate transparent-rules``: the kernel rules that send a sandbox's TCP to the proxy.

Three ways to pick the sandbox's traffic, each printed for iptables and for nftables:

- ``--interface IF``: everything arriving on IF (a veth or bridge of the sandbox); PREROUTING.
- ``--source CIDR``: everything from those addresses; PREROUTING.
- ``--uid UID``: processes of that user on this host; OUTPUT, which also sees the proxy's own
  connections, so the proxy's user (``--proxy-uid``) is excluded — without that exclusion the
  proxy's upstream connections would be redirected back into it (a loop; the proxy refuses the
  looped connection once, as it comes from no claim's address).

PREROUTING rules never see the proxy's own connections (those leave through OUTPUT), so the
interface and source forms cannot loop. Redirected connections keep their original destination
(SO_ORIGINAL_DST), which the transparent listener reads.
"""

from __future__ import annotations

import ipaddress
import re

_IFACE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")  # Linux IFNAMSIZ is 16 including the NUL


def transparent_rules(
    port: int,
    *,
    interface: str | None = None,
    source: str | None = None,
    uid: int | None = None,
    proxy_uid: int | None = None,
) -> str:
    """Shell-ready iptables and nftables rules; raises ValueError naming the bad argument."""
    if sum(x is not None for x in (interface, source, uid)) != 1:
        raise ValueError("give exactly one of --interface, --source or --uid")
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is outside 1..65535")
    if interface is not None:
        if not _IFACE.match(interface):
            raise ValueError(f"{interface!r} is not an interface name")
        ipt = f"iptables -t nat -A PREROUTING -i {interface} -p tcp -j REDIRECT --to-ports {port}"
        nft_match = f'iifname "{interface}"'
        chain, hook = "prerouting", "prerouting"
    elif source is not None:
        net = ipaddress.ip_network(source, strict=False)
        cmd = "iptables" if net.version == 4 else "ip6tables"
        ipt = f"{cmd} -t nat -A PREROUTING -s {net} -p tcp -j REDIRECT --to-ports {port}"
        nft_match = f"ip{'' if net.version == 4 else '6'} saddr {net}"
        chain, hook = "prerouting", "prerouting"
    else:
        assert uid is not None
        if proxy_uid is None:
            raise ValueError(
                "--uid needs --proxy-uid: the proxy's own connections must be excluded or they loop"
            )
        if proxy_uid == uid:
            raise ValueError("--proxy-uid must differ from --uid (the sandbox's user)")
        ipt = (
            f"iptables -t nat -A OUTPUT -p tcp -m owner --uid-owner {uid} "
            f"-m owner ! --uid-owner {proxy_uid} -j REDIRECT --to-ports {port}"
        )
        nft_match = f"meta skuid {uid} meta skuid != {proxy_uid}"
        chain, hook = "output", "output"
    return "\n".join(
        [
            "# iptables",
            ipt,
            "",
            "# nftables (nft -f FILE)",
            "table inet surrogate {",
            f"  chain {chain} {{",
            f"    type nat hook {hook} priority dstnat; policy accept;",
            f"    {nft_match} meta l4proto tcp redirect to :{port}",
            "  }",
            "}",
            "",
        ]
    )
