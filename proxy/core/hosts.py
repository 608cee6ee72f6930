"""Host names: one canonical form, and egress host patterns matched against it.

Canonical form (used by policy, matching and audit alike):
- lower case, no trailing dot;
- internationalised names as IDNA 2008 A-labels with UTS #46 mapping (RFC 5891, UTS #46),
  so ``BÜCHER.example`` and ``xn--bcher-kva.example`` are the same host;
- IP literals in their ``ipaddress`` compressed form, brackets removed (``[::1]`` → ``::1``);
- the numeric IPv4 spellings that ``inet_aton`` (and so ``getaddrinfo``, curl and browsers, per
  the WHATWG URL standard §3.5 "IPv4 parser") accept, as the dotted quad: ``127.1``,
  ``0x7f000001``, ``2130706433``, ``0177.0.0.1`` are all ``127.0.0.1``. A name made only of
  such numeric parts that is not a valid address (``256.1.1.1``) is refused, not taken as a
  DNS name.

Patterns (RFC 6125 §6.4.3 style, stricter):
- ``api.github.com``: exactly that host;
- ``*.example.com``: any host with at least one more label in front of ``example.com``; never
  ``example.com`` itself, and never ``badexample.com`` (matching is at a label boundary);
- ``*``: any host.

Raises :class:`proxy.core.errors.HostError` for a name that cannot be canonicalised.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

import idna

from proxy.core.errors import HostError

_MAX_NAME = 253
_IPV4_PART = re.compile(r"0x[0-9a-f]+|0[0-7]*|[1-9][0-9]*")  # hex, octal, decimal (inet_aton(3))


def _numeric_ipv4(host: str, raw: str) -> str | None:
    """The dotted quad a 1-4 part numeric spelling means (lower-case ``host``), or None when
    ``host`` is not all numeric parts. Raises HostError for numeric parts out of range."""
    parts = host.split(".")
    if len(parts) > 4 or not all(_IPV4_PART.fullmatch(p) for p in parts):
        return None
    nums = [int(p[2:], 16) if p.startswith("0x") else int(p, 8 if p.startswith("0") else 10) for p in parts]
    last_max = 256 ** (5 - len(nums))  # the last part fills the remaining bytes
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= last_max:
        raise HostError(f"invalid host name {raw!r}: a numeric IPv4 spelling out of range")
    value = nums[-1]
    for i, n in enumerate(nums[:-1]):
        value += n << (24 - 8 * i)
    return str(ipaddress.IPv4Address(value))


# Pure, and called several times per request (hygiene, policy, identify) on the same few names;
# ipaddress parsing alone showed up in the profile. Bounded, so spraying names only evicts.
@functools.lru_cache(maxsize=4096)
def canonical_host(raw: str) -> str:
    """Return the canonical form of ``raw`` (a host name or IP literal, no port).

    Raises HostError naming the value when it is empty, too long, or not valid IDNA.
    """
    host = raw.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise HostError(f"empty host name {raw!r}")
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    host = host.lower()
    if host.endswith("."):  # one trailing dot: the fully qualified spelling of the same name
        host = host[:-1]
    if not host or host.startswith(".") or host.endswith(".") or ".." in host:
        raise HostError(f"invalid host name {raw!r}: empty label")
    if (ip := _numeric_ipv4(host, raw)) is not None:
        return ip
    if host.isascii():
        # Fast path for the usual case; underscores are tolerated because real services use
        # them (e.g. ``_dmarc`` style names) and IDNA would refuse them.
        ascii_host = host
        if not all(c.isalnum() or c in "-._" for c in ascii_host):
            raise HostError(f"invalid host name {raw!r}: only letters, digits, '-', '_' and '.'")
    else:
        try:
            ascii_host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError as e:
            raise HostError(f"invalid host name {raw!r}: {e}") from None
    if any(len(label) > 63 for label in ascii_host.split(".")):
        raise HostError(f"invalid host name {raw!r}: a label is longer than 63 characters")
    if len(ascii_host) > _MAX_NAME:
        raise HostError(f"invalid host name {raw!r}: longer than {_MAX_NAME} characters")
    return ascii_host


def split_authority(value: str) -> tuple[str, int | None]:
    """A Host header / ``:authority`` / SNI value → (canonical host, port or None).

    ``[v6]:port`` and ``name:port`` forms (RFC 9110 §7.2). Raises HostError for a bad name or a
    port that is not 1..65535 in ASCII digits (``str.isdigit`` also accepts '²', which ``int``
    refuses).
    """
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if port and not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise HostError(f"invalid port in Host header {value[:80]!r}")
    return canonical_host(host), (int(port) if port else None)


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A compiled egress host pattern. ``text`` is the canonical spelling, e.g. ``*.github.com``."""

    text: str
    suffix: str | None  # ".github.com" for a wildcard, None for exact or any
    any_host: bool

    @classmethod
    def parse(cls, raw: str) -> HostPattern:
        """Compile ``raw``; raises HostError for a misplaced ``*`` or an invalid name."""
        raw = raw.strip()
        if raw == "*":
            return cls("*", None, True)
        if raw.startswith("*."):
            base = canonical_host(raw[2:])
            if "*" in base:
                raise HostError(f"invalid host pattern {raw!r}: '*' only as the whole first label")
            return cls(f"*.{base}", f".{base}", False)
        if "*" in raw:
            raise HostError(
                f"invalid host pattern {raw!r}: use 'name', '*.suffix' or '*' "
                "('*' only as the whole first label)"
            )
        return cls(canonical_host(raw), None, False)

    def matches(self, host: str) -> bool:
        """True when canonical ``host`` matches this pattern."""
        if self.any_host:
            return True
        if self.suffix is not None:
            return host.endswith(self.suffix) and len(host) > len(self.suffix)
        return host == self.text

    def covers(self, other: HostPattern) -> bool:
        """True when every host ``other`` matches is also matched by this pattern."""
        if self.any_host:
            return True
        if other.any_host:
            return False
        if other.suffix is None:
            return self.matches(other.text)
        return self.suffix is not None and (other.suffix == self.suffix or other.suffix.endswith(self.suffix))

    def __str__(self) -> str:
        return self.text
