"""Substitution: placeholders → secrets in request headers, injections, and violations.

Pure over plain values: header fields as ``(name, value)`` byte pairs, the canonical destination
host, whether the upstream leg is TLS, and the claim's credentials. Secret values are fetched
only after the whole request has been checked, and only for credentials bound to the host.

Where a placeholder may be swapped (this issue's surfaces):
- anywhere inside any header value (``Bearer P``, ``token P``, ``X-Api-Key: P``);
- inside Basic credentials (``Authorization: Basic base64(user:pass)``, RFC 7617 §2): decoded,
  swapped in user and password, re-encoded, as git and curl send them.

A registered placeholder found in a header or in the request target (path and query) toward a
host its credential is not bound to is a *violation*: nothing is swapped and the request is
refused. Toward a bound host over cleartext HTTP it is refused too (a secret only leaves over
verified TLS). In the request target toward a bound host it passes unchanged (``carried``):
query substitution is not a surface yet.

An injection sets its header to ``format`` with ``{value}`` whatever the sandbox sent, toward
bound hosts over TLS only; toward other hosts it does nothing.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from proxy import placeholders
from proxy.decide import Decision, Reason, deny
from proxy.errors import SecretUnavailable
from proxy.policy import Credential

Fields = Sequence[tuple[bytes, bytes]]
log = logging.getLogger("surrogate")
_WS = re.compile(rb"\s+")


@dataclass(slots=True)
class Outcome:
    """What to do with a request: new header fields (None: unchanged) or a refusal.

    ``used`` maps each swapped or injected credential name to the version used;
    ``carried`` names credentials whose placeholder passed unchanged.
    """

    fields: list[tuple[bytes, bytes]] | None = None
    refusal: Decision | None = None
    used: dict[str, int] = field(default_factory=dict)
    carried: list[str] = field(default_factory=list)
    violated: str | None = None  # the credential whose placeholder was refused


@dataclass(slots=True)
class _Hit:
    index: int  # header field index
    credential: Credential
    basic: bool  # found inside decoded Basic credentials


def _decode_basic(value: bytes) -> bytes | None:
    """The decoded credentials of a Basic ``value``, read leniently (any whitespace after the
    scheme, inside or around the token; missing padding) as servers do, so an odd spelling
    cannot carry a placeholder past the check."""
    parts = value.strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    token = _WS.sub(b"", parts[1])
    try:
        return base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def substitute_request(
    fields: Fields,
    target: bytes,
    host: str,
    tls: bool,
    by_placeholder: Mapping[bytes, Credential],
    injections: Sequence[Credential],
    now: float = 0.0,
) -> Outcome:
    """Plan the substitution for one request toward canonical ``host``.

    ``fields`` are the header fields as sent (Proxy-* already removed); ``target`` the request
    target (path and query); ``now`` the time (unix seconds) expiry is judged at. Raises
    nothing: an unreadable or expired secret becomes a refusal.
    """
    out = Outcome()
    hits: list[_Hit] = []
    for i, (name, value) in enumerate(fields):
        for m in placeholders.find(value):
            cred = by_placeholder.get(m.group())
            if cred is not None:
                hits.append(_Hit(i, cred, False))
        decoded = _decode_basic(value) if name.lower() == b"authorization" else None
        if decoded:
            for m in placeholders.find(decoded):
                cred = by_placeholder.get(m.group())
                if cred is not None:
                    hits.append(_Hit(i, cred, True))
    for h in hits:
        if not h.credential.bound_to(host):
            where = fields[h.index][0].decode("latin-1")
            out.refusal = _violation(h.credential, host, f"header {where}")
            out.violated = h.credential.name
            return out
        if not tls:
            out.violated = h.credential.name
            out.refusal = deny(
                Reason.CLEARTEXT_CREDENTIAL,
                f"placeholder of credential {h.credential.name!r} sent over cleartext HTTP; "
                "credentials are only sent over verified TLS (use https://)",
            )
            return out
    # The target is scanned as sent and percent-decoded, so "%5F" cannot hide "_".
    decoded_target = unquote_to_bytes(target) if b"%" in target else target
    for m in [*placeholders.find(target), *placeholders.find(decoded_target)]:
        cred = by_placeholder.get(m.group())
        if cred is None:
            continue
        if not cred.bound_to(host):
            out.refusal = _violation(cred, host, "request target")
            out.violated = cred.name
            return out
        if cred.name not in out.carried:
            out.carried.append(cred.name)

    active = [c for c in injections if c.inject and tls and c.bound_to(host)]
    if not hits and not active:
        return out
    needed = {h.credential.name: h.credential for h in hits}
    needed.update({c.name: c for c in active})
    for c in needed.values():
        if c.expired(now):
            out.refusal = deny(
                Reason.CREDENTIAL_EXPIRED,
                f"credential {c.name!r} expired; ask for a fresh one (nothing was sent)",
            )
            return out
    try:
        values = {name: c.secret() for name, c in needed.items()}
    except SecretUnavailable as e:  # fail closed: no secret, no request
        # The sandbox sees which credential, not where it is kept; the operator's log has it all.
        log.warning("credential unavailable: %s", e)
        names = ", ".join(repr(n) for n in sorted(needed))
        out.refusal = deny(
            Reason.CREDENTIAL_UNAVAILABLE, f"credential {names} is unavailable right now", status=503
        )
        return out
    new = list(fields)
    for h in hits:
        name, value = new[h.index]
        secret, _ = values[h.credential.name]
        ph, real = h.credential.placeholder.encode(), secret.reveal().encode()
        if h.basic:
            decoded = _decode_basic(value)
            if decoded is not None and ph in decoded:
                scheme = value.strip().split(None, 1)[0]
                value = scheme + b" " + base64.b64encode(decoded.replace(ph, real))
        else:
            value = value.replace(ph, real)
        new[h.index] = (name, value)
    for c in active:
        assert c.inject is not None
        header = c.inject.header.encode("latin-1")
        secret, _ = values[c.name]
        value = c.inject.format.replace("{value}", secret.reveal()).encode()
        new = [(n, v) for n, v in new if n.lower() != header.lower()]
        new.append((header, value))
    out.fields = new
    out.used = {name: version for name, (_, version) in values.items()}
    return out


def _violation(cred: Credential, host: str, where: str) -> Decision:
    return deny(
        Reason.PLACEHOLDER_VIOLATION,
        f"placeholder of credential {cred.name!r} in {where} is headed for {host}, "
        "which that credential is not bound to",
    )
