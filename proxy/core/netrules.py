"""``surrogate transparent-rules``: the kernel rules that fence a sandbox in.

The promise of transparent mode is that the sandbox has no way out except through surrogate. The
printed rules therefore do two things, for IPv4 and IPv6 alike:

1. **redirect** every TCP connection of the sandbox to the proxy's transparent port (which reads
   the original destination with SO_ORIGINAL_DST);
2. **drop** everything else the sandbox sends that the proxy does not handle: UDP (QUIC/HTTP3,
   DNS), ICMP and every other protocol, and, when the proxy has no IPv6 listener
   (``ipv6=False``), all of its IPv6. The only exception is ICMPv6 neighbour discovery toward
   the host (without it no IPv6 packet reaches the proxy at all) and, when the operator names
   one, a resolver (``resolvers``: UDP and TCP port 53 to those addresses only, never redirected).

DNS, decided: surrogate does not answer DNS itself. Either the operator names a resolver the
rules let through (``--resolver ADDR``; DNS is a channel out of the sandbox, so name one you
control and log), or the sandbox gets no DNS at all and resolves from its ``/etc/hosts``.

Three ways to pick the sandbox's traffic, each printed for iptables + ip6tables and as one nftables
``inet`` table (``table inet surrogate``; several sandboxes' rules merge into it):

- ``interface``: everything arriving on that interface (a veth or bridge); PREROUTING, INPUT and
  FORWARD. With ``sources`` as well, an anti-spoof rule drops what arrives there from any other
  source address (raw/prerouting, before connection tracking and NAT). Its packets are marked
  with :func:`interface_mark` (unless a bridge port's rule marked them first), so that a claim
  with ``interface:`` can check where its connections arrived.
- ``sources``: everything from those networks; one family's rules per network given. A family
  without a source cannot be fenced by address (its IPv6 is not matched): prefer ``interface``.
  Refused unless ``unsafe_source_only`` (``--unsafe-source-only``): a sandbox that can change its
  source address (root in its own network namespace: ``ip addr add``) is matched by none of these
  rules and goes out unfenced, unredirected and unaudited (found in review, r3: tests/e2e/
  test_fence_escapes.py). Use it only where the sandbox cannot pick its address.
- ``uid``: processes of that user on this host; OUTPUT, which also sees the proxy's own
  connections, so the proxy's user (``proxy_uid``) is excluded — without that exclusion the
  proxy's upstream connections would be redirected back into it (a loop, which the proxy
  refuses once).

``bridge_port`` (with ``sources``) prints the per-port anti-spoof rules for sandboxes that share a
bridge: ebtables and an nftables ``bridge`` table accept on that port only IPv4, IPv6 and ARP
from the sandbox's own addresses and drop every other frame (other sources, other ethertypes,
VLAN-tagged frames), and mark what it may send with the port's mark (:func:`interface_mark`),
which the proxy checks against a claim's ``interface``; the nft rules also drop a neighbour
advertisement whose target is not one of the sandbox's own IPv6 addresses (ebtables cannot
match the target: use the nft rules where sandboxes have IPv6). They also drop every frame the bridge
would forward from that port to another port: bridged frames reach the host's IP filter only
when ``br_netfilter`` is loaded with ``bridge-nf-call-iptables=1``, so without this a sandbox
reached its neighbours on the bridge (and anything else bridged there) directly, with no
redirect and no audit (found in review, r3). The sandbox reaches the host alone, where the
bridge's own fence (``--interface BRIDGE``) applies.

Filter rules are inserted at the top of their chains (``-I CHAIN N``), so an earlier ACCEPT of the
host's own firewall cannot open the fence; in nftables a drop in any table is final. The nat
OUTPUT chain uses the numeric priority -100: nftables 1.0.6 (Debian 12) refuses ``dstnat`` there.
"""

from __future__ import annotations

import ipaddress
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

_IFACE = re.compile(r"^[A-Za-z0-9_.@-]{1,15}$")  # Linux IFNAMSIZ is 16 including the NUL
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
IP = ipaddress.IPv4Address | ipaddress.IPv6Address

# ICMPv6 the host must receive for IPv6 to work at all (RFC 4861 §4.3, §4.4); nothing is forwarded
_ND = ("neighbour-solicitation", "neighbour-advertisement")
_ND_NFT = "{ nd-neighbor-solicit, nd-neighbor-advert }"
_MARK_BIT = 0x80000000


def interface_mark(interface: str) -> int:
    """The firewall mark the printed rules give a sandbox's packets arriving on ``interface``:
    CRC-32 of the name with the top bit set (a stable number that survives re-creating the veth).
    The proxy reads it back from the accepted socket (``net.ipv4.tcp_fwmark_accept=1``). A
    sandbox in its own network namespace cannot forge it: the kernel clears a packet's mark when
    it crosses into another namespace (``skb_scrub_packet``)."""
    return _MARK_BIT | (zlib.crc32(interface.encode()) & 0x7FFFFFFF)


@dataclass(frozen=True, slots=True)
class _Form:
    """One way of picking the sandbox's packets, spelled for each tool."""

    hook: str  # "prerouting" (traffic from another namespace) or "output" (a local user)
    ipt: str  # the iptables match, e.g. "-i veth0"
    nft: str  # the nftables match, e.g. 'iifname "veth0"'
    families: tuple[int, ...]  # which of 4 and 6 the match can see


def transparent_rules(
    port: int,
    *,
    interface: str | None = None,
    source: str | Sequence[str] | None = None,
    uid: int | None = None,
    proxy_uid: int | None = None,
    ipv6: bool = True,
    resolvers: Sequence[str] = (),
    bridge_port: str | None = None,
    unsafe_source_only: bool = False,
) -> str:
    """Shell-ready iptables/ip6tables commands and an ``nft -f`` file; raises ValueError naming
    the bad argument. ``source`` is one CIDR or several (at most one form among ``interface``,
    ``source`` and ``uid``; ``source`` may join ``interface`` or ``bridge_port`` as the
    anti-spoof networks). ``source`` alone is refused without ``unsafe_source_only`` (see the
    module docstring)."""
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is outside 1..65535")
    sources = _networks([source] if isinstance(source, str) else list(source or ()))
    dns = [_address(r) for r in resolvers]
    if bridge_port is not None:
        if interface is not None or uid is not None:
            raise ValueError("--bridge-port takes only --source (print the fence with --interface BRIDGE)")
        return _bridge(_iface(bridge_port), sources)
    if sum(x is not None for x in (interface, uid)) + (bool(sources) and interface is None) != 1:
        raise ValueError("give exactly one of --interface, --source or --uid")
    if sources and interface is None and uid is None and not unsafe_source_only:
        raise ValueError(
            "--source alone fences only those addresses: a sandbox that changes its address goes "
            "around it; give --interface IF (with --source as its anti-spoof networks), or "
            "--unsafe-source-only where the sandbox cannot change its address"
        )
    if interface is not None:
        name = _iface(interface)
        form = _Form("prerouting", f"-i {name}", f'iifname "{name}"', (4, 6))
    elif uid is not None:
        if proxy_uid is None:
            raise ValueError(
                "--uid needs --proxy-uid: the proxy's own connections must be excluded or they loop"
            )
        if proxy_uid == uid:
            raise ValueError("--proxy-uid must differ from --uid (the sandbox's user)")
        form = _Form(
            "output",
            f"-m owner --uid-owner {uid} -m owner ! --uid-owner {proxy_uid}",
            f"meta skuid {uid} meta skuid != {proxy_uid}",
            (4, 6),
        )
    else:
        form = _Form("prerouting", "", "", tuple(sorted({n.version for n in sources})))
    out = ["# surrogate fence: the sandbox's TCP goes to the proxy, everything else is dropped"]
    if form.hook == "prerouting" and interface is None:
        out.append("# (--source: only the families named are matched; prefer --interface)")
        out.append("# UNSAFE: a sandbox that changes its source address is matched by none of these rules")
    for version in (4, 6):
        out += _iptables(form, version, port, ipv6, dns, sources if interface is None else [])
    spoof = _antispoof_ipt(form, sources) if interface is not None and sources else []
    out += spoof
    nft = _nft(form, port, ipv6, dns, sources, interface is not None)
    if interface is not None:
        mark = f"{interface_mark(interface):#010x}"
        out += [
            "",
            f"# the arrival mark {mark} (claims with interface: {interface}); a port's own mark stays",
            "sysctl -w net.ipv4.tcp_fwmark_accept=1",
            *(f"{cmd} -t mangle -A PREROUTING {form.ipt} -m mark --mark 0 -j MARK --set-mark {mark}"
              for cmd in ("iptables", "ip6tables")),
        ]  # fmt: skip
        nft[-1:-1] = [
            "  chain arrival {",
            "    type filter hook prerouting priority mangle; policy accept;",
            f"    {form.nft} meta mark 0 meta mark set {mark}",
            "  }",
        ]
    out += ["", "# nftables (nft -f FILE)", *nft, ""]
    return "\n".join(out)


def _iface(name: str) -> str:
    if not _IFACE.match(name):
        raise ValueError(f"{name!r} is not an interface name")
    return name


def _networks(values: list[str]) -> list[Net]:
    return [ipaddress.ip_network(v, strict=False) for v in values]


def _address(value: str) -> IP:
    try:
        return ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        raise ValueError(f"--resolver {value!r} is not an IP address") from None


def _iptables(
    form: _Form, version: int, port: int, ipv6: bool, dns: list[IP], sources: list[Net]
) -> list[str]:
    """One family's iptables (or ip6tables) commands, for one source network each when
    ``sources`` (the --source form), else for the form's own match."""
    cmd = "iptables" if version == 4 else "ip6tables"
    label = "IPv4" if version == 4 else "IPv6"
    if version not in form.families:
        return ["", f"# {label}: no --source of this family was given; its traffic is NOT fenced"]
    matches = [f"-s {n}" for n in sources if n.version == version] if sources else [form.ipt]
    redirect = version == 4 or ipv6
    resolvers = [r for r in dns if r.version == version] if redirect else []
    nat, flt = ("OUTPUT", "OUTPUT") if form.hook == "output" else ("PREROUTING", "INPUT")
    chains = [flt] if form.hook == "output" else [flt, "FORWARD"]
    lines = ["", f"# {label} ({cmd})" + ("" if redirect else ": the proxy has no IPv6 listener, all dropped")]
    for m in matches:
        rules: dict[str, list[str]] = {c: [] for c in chains}  # in order; inserted at the top
        for r in resolvers:
            lines.append(f"{cmd} -t nat -A {nat} {m} -d {r} -p tcp --dport 53 -j RETURN")
            for chain in chains:
                rules[chain] += [f"{m} -d {r} -p {p} --dport 53 -j ACCEPT" for p in ("udp", "tcp")]
        if redirect:
            lines.append(f"{cmd} -t nat -A {nat} {m} -p tcp -j REDIRECT --to-ports {port}")
            dport = f" --dport {port}" if form.hook == "prerouting" else ""
            rules[flt].append(f"{m} -p tcp{dport} -m conntrack --ctstate DNAT -j ACCEPT")
            if version == 6 and form.hook == "prerouting":
                rules[flt] += [f"{m} -p ipv6-icmp --icmpv6-type {kind} -j ACCEPT" for kind in _ND]
        for chain in chains:
            rules[chain].append(f"{m} -j DROP")
            lines += [f"{cmd} -t filter -I {chain} {i} {rule}" for i, rule in enumerate(rules[chain], 1)]
    return lines


def _antispoof_ipt(form: _Form, sources: list[Net]) -> list[str]:
    lines = ["", "# anti-spoof: on this interface, only the sandbox's own source addresses"]
    for version, cmd in ((4, "iptables"), (6, "ip6tables")):
        allowed = [n for n in sources if n.version == version]
        if version == 6:
            allowed.append(ipaddress.IPv6Network("fe80::/10"))  # neighbour discovery
        at = 1
        for n in allowed:
            lines.append(f"{cmd} -t raw -I PREROUTING {at} {form.ipt} -s {n} -j RETURN")
            at += 1
        lines.append(f"{cmd} -t raw -I PREROUTING {at} {form.ipt} -j DROP")
    return lines


def _set(nets: Sequence[Net | IP]) -> str:
    return str(nets[0]) if len(nets) == 1 else "{ " + ", ".join(str(n) for n in nets) + " }"


def _nft(
    form: _Form, port: int, ipv6: bool, dns: list[IP], sources: list[Net], on_interface: bool
) -> list[str]:
    families = [(4, "ip"), *([(6, "ip6")] if 6 in form.families else [])]
    if sources and not on_interface:  # the --source form: one match per family named
        matches = [(v, f"{p} saddr {_set([n for n in sources if n.version == v])}") for v, p in families]
        matches = [(v, m) for v, m in matches if v in form.families]
    else:
        matches = [(v, f"meta nfproto ipv{v} {form.nft}".strip()) for v, _ in families]
    redirected = [(v, m) for v, m in matches if v == 4 or ipv6]
    nat_prio = "dstnat" if form.hook == "prerouting" else "-100"  # nft 1.0.6: no dstnat in output
    nat = [
        f"  chain redirect_{form.hook} {{",
        f"    type nat hook {form.hook} priority {nat_prio}; policy accept;",
    ]
    flt_hook = "input" if form.hook == "prerouting" else "output"
    flt = [f"  chain fence_{flt_hook} {{", f"    type filter hook {flt_hook} priority filter; policy accept;"]
    fwd = ["  chain fence_forward {", "    type filter hook forward priority filter; policy accept;"]
    for v, m in redirected:
        resolvers = [r for r in dns if r.version == v]
        to = "ip" if v == 4 else "ip6"
        if resolvers:
            nat.append(f"    {m} {to} daddr {_set(resolvers)} th dport 53 accept")
            for chain in (flt, fwd):
                chain.append(
                    f"    {m} {to} daddr {_set(resolvers)} meta l4proto {{ udp, tcp }} th dport 53 accept"
                )
        nat.append(f"    {m} meta l4proto tcp redirect to :{port}")
        tcp = f"tcp dport {port}" if form.hook == "prerouting" else "meta l4proto tcp"
        flt.append(f"    {m} {tcp} ct status dnat accept")
        if v == 6 and form.hook == "prerouting":
            flt.append(f"    {m} icmpv6 type {_ND_NFT} accept")
    for _, m in matches:
        flt.append(f"    {m} drop")
        fwd.append(f"    {m} drop")
    chains = [*nat, "  }", *flt, "  }"] + ([*fwd, "  }"] if form.hook == "prerouting" else [])
    if on_interface and sources:
        spoof = ["  chain antispoof {", "    type filter hook prerouting priority raw; policy accept;"]
        v4 = [n for n in sources if n.version == 4]
        v6 = [*[n for n in sources if n.version == 6], ipaddress.IPv6Network("fe80::/10")]
        spoof.append(
            f"    {form.nft} meta nfproto ipv4 ip saddr != {_set(v4)} drop"
            if v4
            else f"    {form.nft} meta nfproto ipv4 drop"
        )
        spoof.append(f"    {form.nft} meta nfproto ipv6 ip6 saddr != {_set(v6)} drop")
        chains += [*spoof, "  }"]
    return ["table inet surrogate {", *chains, "}"]


def _bridge(port: str, sources: list[Net]) -> str:
    """Per-port anti-spoof and marking for a sandbox on a shared bridge (ebtables and nft)."""
    if not sources:
        raise ValueError("--bridge-port needs --source: the sandbox's own addresses on that port")
    mark = f"{interface_mark(port):#010x}"
    v4 = [n for n in sources if n.version == 4]
    v6 = [*[n for n in sources if n.version == 6], ipaddress.IPv6Network("fe80::/10")]
    out = [
        f"# surrogate anti-spoof for bridge port {port}: only the sandbox's own addresses, marked {mark}",
        "# the proxy reads the mark of each connection (claims with interface: " + port + "):",
        "sysctl -w net.ipv4.tcp_fwmark_accept=1",
        "",
        "# ebtables",
    ]
    # ebtables takes one address per rule: accept the own ones, then drop the family
    marked = f"-j mark --mark-set {mark} --mark-target ACCEPT"
    for n in v4:
        out.append(f"ebtables -t nat -A PREROUTING -i {port} -p IPv4 --ip-src {n} {marked}")
        out.append(f"ebtables -t nat -A PREROUTING -i {port} -p ARP --arp-ip-src {n} -j ACCEPT")
    for n6 in v6:
        out.append(f"ebtables -t nat -A PREROUTING -i {port} -p IPv6 --ip6-src {n6} {marked}")
    out += [
        f"ebtables -t nat -A PREROUTING -i {port} -j DROP",  # any other frame: deny by default
        "# nothing is bridged from this port to another: the sandbox reaches the host alone",
        f"ebtables -t filter -A FORWARD -i {port} -j DROP",
    ]
    out += [
        "",
        "# nftables (nft -f FILE)",
        "table bridge surrogate {",
        *_nd_targets(port, mark, [n for n in sources if n.version == 6]),
        "  chain antispoof {",
        "    type filter hook prerouting priority -200; policy accept;",
        f'    iifname "{port}" icmpv6 type nd-neighbor-advert jump nd_{mark[2:]}',
        (
            f'    iifname "{port}" ether type ip ip saddr {_set(v4)} meta mark set {mark} accept'
            if v4
            else f'    iifname "{port}" ether type ip drop'
        ),
        *([f'    iifname "{port}" ether type arp arp saddr ip {_set(v4)} accept'] if v4 else []),
        f'    iifname "{port}" ether type ip6 ip6 saddr {_set(v6)} meta mark set {mark} accept',
        f'    iifname "{port}" drop',
        "  }",
        "  chain isolate {",
        "    type filter hook forward priority -200; policy accept;",
        f'    iifname "{port}" drop',
        "  }",
        "}",
        "",
    ]
    return "\n".join(out)


def _nd_targets(port: str, mark: str, own: list[ipaddress.IPv6Network]) -> list[str]:
    """An nft chain that lets a neighbour advertisement from ``port`` through only when its
    target (RFC 4861 §4.4, the 16 bytes after type, code, checksum and flags) is one of the
    sandbox's own IPv6 networks: the source-address check cannot see the target, and an NA
    from the sandbox's own link-local address naming another sandbox's address as its target
    moved the host's neighbour entry for that address to this port (review r3). Written as raw
    payload: nft 1.0.6 has no ``icmpv6 taddr``. ebtables cannot match the target at all."""
    lines = [f"  chain nd_{mark[2:]} {{"]
    for n in own:
        mask, value = int(n.netmask), int(n.network_address)
        lines.append(f"    @th,64,128 & {mask:#034x} == {value:#034x} return")
    lines += [f'    iifname "{port}" drop', "  }"]
    return lines
