"""The control API's edges, pure: which path segment holds a ``/``, and whether a request's
``Host`` and ``Origin`` name the TCP listener itself.

Path parameters (claim id, credential name) never contain ``/``; a client that sends one, plain
or percent-encoded (``%2F``, either case), gets ``422`` naming the field rather than ``404`` or,
worse, another resource: ``POST /v1/claims/a%2Ftoken`` is decoded by the server to
``/v1/claims/a/token`` and would rotate claim ``a``'s token. So an encoded slash anywhere in the
path is refused before routing (:func:`encoded_slash_field`), and a path that matches no route
because of a plain slash is told which field it broke (:func:`plain_slash_field`).

DNS rebinding (a web page in an operator's browser whose name is re-pointed at 127.0.0.1): the
browser then sends ``Host: evil.example:9090`` and ``Origin: http://evil.example:9090``. The TCP
listener accepts only a ``Host`` that is its own address (or ``localhost``) with its port, and an
``Origin``, when present, that is ``http://`` + one of those (:func:`foreign_authority`); a TLS
listener accepts exactly ``https://`` + one of those instead (a browser sends its page's own https
origin on POST), never the other scheme. Names
other than ``localhost`` are never accepted: the operator's resolver is not the attacker's, but
any other name may be. Sources: RFC 9110 §7.2 (Host), RFC 6454 §7 (Origin).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

_CLAIMS = [b"", b"v1", b"claims"]


def _field(rest: list[str], index: int) -> str:
    """The path parameter at ``index`` of the segments after ``/v1/claims/``."""
    if index == 0:
        return "claim"
    if index == 2 and rest[1] == "credentials":
        return "name"
    return "path"


def encoded_slash_field(raw_path: bytes) -> str | None:
    """``claim``, ``name`` or ``path`` when a segment of ``raw_path`` (as sent, query excluded)
    holds a percent-encoded ``/``; None when none does."""
    path = raw_path.split(b"?", 1)[0]
    if b"%2f" not in path.lower():
        return None
    segments = path.split(b"/")
    rest = [unquote(s.decode("latin-1")) for s in segments[3:]] if segments[:3] == _CLAIMS else []
    for i, s in enumerate(rest):
        if "/" in s:
            return _field(rest, i)
    return "path"


def plain_slash_field(path: str) -> str | None:
    """For a path under ``/v1/claims/`` that matched no route: ``claim`` or ``name`` when it
    only makes sense with a ``/`` inside that parameter; None otherwise."""
    segments = path.split("/")
    if segments[:3] != ["", "v1", "claims"] or len(segments) < 5 or "" in segments[3:]:
        return None
    rest = segments[3:]  # a claim id and what follows it
    if "credentials" in rest[1:]:
        at = rest.index("credentials", 1)
        if at > 1:
            return "claim"
        return "name" if len(rest) > at + 2 else None
    if len(rest) == 2 and rest[1] == "token":
        return None
    return "claim"


def allowed_authorities(host: str, port: int, names: Sequence[str] = ()) -> frozenset[str]:
    """The ``Host`` values a TCP listener on ``host``:``port`` answers (lower case): its own
    address and ``localhost``, and each of ``names`` (``surrogate control --control-name``, the
    names a cluster's clients reach it by; a TLS listener's certificate names them too)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # "localhost" (the CLI takes it): the loopback addresses it names
        own = {host.lower(), "localhost", "127.0.0.1", "[::1]"}
    else:
        own = {f"[{ip}]" if ip.version == 6 else str(ip), "localhost"}
    named = {f"[{n}]" if ":" in n else n for n in (n.lower().strip("[]") for n in names)}  # RFC 3986 §3.2.2
    return frozenset(f"{n}:{port}" for n in own | named)


def foreign_authority(
    host: str | None, origin: str | None, allowed: frozenset[str], scheme: str = "http"
) -> str | None:
    """``"Host"`` or ``"Origin"`` when that header names another authority than the listener's
    (a missing Host counts as another); None when the request may be served. ``scheme``: the
    listener's own (``"https"`` when it serves TLS); an Origin of any other scheme is foreign."""
    if host is None or host.strip().lower() not in allowed:
        return "Host"
    if origin is not None:
        try:
            parts = urlsplit(origin.strip())
            netloc = parts.netloc.lower()
        except ValueError:
            return "Origin"
        if parts.scheme.lower() != scheme or netloc not in allowed or parts.path not in ("", "/"):
            return "Origin"
    return None
