"""Substitution: placeholders → secrets in a request, injections, and violations.

Pure over plain values: header fields as ``(name, value)`` byte pairs, the request target, the
canonical destination host, whether the upstream leg is TLS, and the claim's credentials. Secret
values are fetched only after the whole request head has been checked, and only for credentials
bound to the host.

Surfaces (:class:`proxy.core.policy.Surface`), each enabled per credential (default header, basic),
narrowed by the credential's slots (:mod:`proxy.core.slots`):
- ``header``: inside the value of one of the credential's header slots (default: the headers that
  carry credentials in practice, ``Authorization``, ``X-Api-Key``, ...; never ``Origin``,
  ``Cookie``, ``X-Request-Id`` unless named), as ``Bearer P``, ``token P``, ``P``;
- ``basic`` (and its alias ``userinfo``): inside Basic credentials (``Authorization: Basic
  base64(user:pass)``, RFC 7617 §2): decoded, swapped in the credential's Basic parts (default the
  password only), re-encoded, as git and curl send them, including those they build from
  ``https://user:P@host`` URLs;
- ``query``: in the query of the request target, spelled raw or percent-encoded (``surr%5F…``);
  the secret is percent-encoded as a query component needs (RFC 3986 §3.4: every byte but the
  unreserved ones, so ``&``, ``=``, ``+`` and ``#`` cannot change the query's shape);
- ``body``: the request body, streaming (:class:`BodyResolver`, driven by :mod:`proxy.core.bodies`).
The path is never a surface; a placeholder there is judged like one on a surface not enabled.
The target is scanned as sent and percent-decoded, so ``%5F`` cannot hide ``_``.

The violation scan reads more than the swap does: header names, and every spelling
:func:`proxy.core.spellings.hidden` reads (percent-encoding, base64 and base64url at any alignment,
nested) in header values, Basic credentials, the query and the path. Such a hit is never swapped:
toward a host its credential is not bound to it is a violation, toward a bound one it is judged
like a placeholder outside the credential's slots (``on_misplaced``).

Decision for a registered placeholder found on surface S, credential C, toward host H:
- C not bound to H, S a header, Basic credentials, the query or the path: a *violation*, refused
  (403), whatever C says;
- C bound to H, S enabled for C and the hit in one of C's slots, spelled raw: swapped; over
  cleartext HTTP refused instead (a secret only leaves over verified TLS);
- otherwise (S not enabled for C, outside its slots, another spelling, or a body toward a host C
  is not bound to): C's
  ``on_misplaced``: ``carry`` passes the placeholder inert (audited as carried, with S),
  ``block`` refuses the request, ``terminate`` closes the connection. In a body, whose request
  head has already left, ``block`` closes the connection too.

An injection sets its header to ``format`` with ``{value}`` whatever the sandbox sent, toward
bound hosts over TLS only; toward other hosts it does nothing.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from proxy.core import bodies, placeholders, slots, spellings
from proxy.core.decide import Decision, Reason, deny
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Credential, Misplaced, Surface
from proxy.core.secrets import Secret
from proxy.core.slots import BasicPart

Fields = Sequence[tuple[bytes, bytes]]
_WS = re.compile(rb"\s+")
_URLSAFE = bytes.maketrans(b"-_", b"+/")


@dataclass(slots=True)
class Outcome:
    """What to do with a request: new header fields and target (None: unchanged) or a refusal.

    ``used`` maps each swapped or injected credential name to the version used; ``carried``
    names credentials whose placeholder passed unchanged, ``carried_on`` the same as
    ``(name, surface)`` pairs. A refusal with ``terminate`` closes the connection instead of
    answering. ``violated``/``violation_surface`` name the credential and surface refused.
    """

    fields: list[tuple[bytes, bytes]] | None = None
    target: bytes | None = None
    refusal: Decision | None = None
    terminate: bool = False
    used: dict[str, int] = field(default_factory=dict)
    carried: list[str] = field(default_factory=list)
    carried_on: list[tuple[str, str]] = field(default_factory=list)
    violated: str | None = None  # the credential whose placeholder was refused
    violation_surface: str | None = None
    unavailable: str | None = None  # why a value could not be read, for the operator's log only

    def carry(self, name: str, surface: Surface) -> None:
        if name not in self.carried:
            self.carried.append(name)
        if (name, surface.value) not in self.carried_on:
            self.carried_on.append((name, surface.value))

    def refuse(self, cred: Credential, surface: Surface, decision: Decision, terminate: bool = False) -> None:
        self.refusal, self.terminate = decision, terminate
        self.violated, self.violation_surface = cred.name, surface.value


@dataclass(slots=True)
class _Hit:
    surface: Surface
    credential: Credential
    index: int = -1  # header field index, for header and Basic hits
    swappable: bool = True  # False: a slot the credential is not swapped in, or another spelling
    where: str = "request target"  # for messages; never the value
    part: BasicPart | None = None  # Basic hits: the part it was found in


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


def _registered(value: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[Credential]:
    """Registered credentials whose placeholder is in ``value`` as sent or percent-decoded."""
    found = placeholders.find(value)
    if b"%" in value:
        found += placeholders.find(unquote_to_bytes(value))
    out: list[Credential] = []
    for m in found:
        cred = by_placeholder.get(m.group())
        if cred is not None and cred not in out:
            out.append(cred)
    return out


def _spelled(ph: bytes) -> re.Pattern[bytes]:
    """``ph`` with each byte raw or percent-encoded (either hex case), as a query may hold it."""
    parts = []
    for b in ph:
        hx = f"{b:02X}".encode()
        alts = {hx, hx.lower(), hx[:1] + hx[1:].lower(), hx[:1].lower() + hx[1:]}
        parts.append(b"(?:" + re.escape(bytes([b])) + b"|%(?:" + b"|".join(sorted(alts)) + b"))")
    return re.compile(b"".join(parts) + rb"(?![A-Za-z0-9])")


def _misplaced(out: Outcome, cred: Credential, surface: Surface, host: str, where: str = "") -> None:
    if cred.on_misplaced is Misplaced.CARRY:
        out.carry(cred.name, surface)
        return
    slots_ = f"its surfaces: {', '.join(sorted(cred.surfaces)) or 'none'}"
    if surface in (Surface.HEADER, Surface.BASIC):
        parts = ", ".join(p for p in slots.BASIC_PARTS if p in cred.basic_parts) or "none"
        slots_ += f"; its headers: {slots.display(cred.headers)}; its Basic parts: {parts}"
    out.refuse(
        cred,
        surface,
        deny(
            Reason.PLACEHOLDER_MISPLACED,
            f"placeholder of credential {cred.name!r} found in {where or 'the ' + surface} toward "
            f"{host}, where that credential is not swapped ({slots_})",
        ),
        terminate=cred.on_misplaced is Misplaced.TERMINATE,
    )


def _header_hits(i: int, name: bytes, value: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[_Hit]:
    """Every registered placeholder in header field ``i``: raw in the value (swappable in the
    credential's header slots), in Basic credentials (swappable in its Basic parts), and in any
    other spelling of the value or of the name (never swappable; see :mod:`proxy.core.spellings`)."""
    found = spellings.hidden(value, by_placeholder)  # the raw spellings too: none, no hit
    named = spellings.hidden(name, by_placeholder)
    head = value.lstrip()[:6]
    basic = head[:5].lower() == b"basic" and head[5:6].isspace()
    if not (found or named or basic):
        return []  # the common case, kept cheap: most fields hold no placeholder at all
    where = f"header {name.decode('latin-1')}"
    hits: list[_Hit] = []
    for m in placeholders.find(value):
        cred = by_placeholder.get(m.group())
        if cred is not None:
            hits.append(_Hit(Surface.HEADER, cred, i, cred.swaps_in_header(name), where))
    decoded = _decode_basic(value) if basic and name.lower() == b"authorization" else None
    if decoded:
        user, password = slots.split_basic(decoded)
        for part, text in ((BasicPart.USER, user), (BasicPart.PASSWORD, password or b"")):
            for m in placeholders.find(text):
                cred = by_placeholder.get(m.group())
                if cred is not None:
                    in_part = f"the Basic {'user name' if part is BasicPart.USER else 'password'} of {where}"
                    hits.append(_Hit(Surface.BASIC, cred, i, cred.swaps_in_basic(part), in_part, part))
    seen = {h.credential.name for h in hits}
    # Basic credentials (also base64url ones, in any header) are decoded and read again, so that
    # their own base64 is not one of the layers the scan reads
    again = decoded or (_decode_basic(value.translate(_URLSAFE)) if basic else None)
    for ph in found + (spellings.hidden(again, by_placeholder) if again else []):
        cred = by_placeholder[ph]
        if cred.name not in seen:
            seen.add(cred.name)
            surface = Surface.BASIC if basic else Surface.HEADER
            hits.append(_Hit(surface, cred, i, False, f"{where}, encoded"))
    hits += [_Hit(Surface.HEADER, by_placeholder[ph], i, False, "a header name") for ph in named]
    return hits


def _target_hits(path: bytes, query: bytes, by_placeholder: Mapping[bytes, Credential]) -> list[_Hit]:
    """Registered placeholders in the request target: in the path (never swappable) and in the
    query (swappable when spelled raw or percent-encoded once; any other spelling is not)."""
    hits = [
        _Hit(Surface.PATH, by_placeholder[ph], swappable=False)
        for ph in spellings.hidden(path, by_placeholder)
    ]
    found = _registered(query, by_placeholder)
    hits += [_Hit(Surface.QUERY, c) for c in found]
    for ph in spellings.hidden(query, by_placeholder):
        if by_placeholder[ph] not in found:
            hits.append(_Hit(Surface.QUERY, by_placeholder[ph], swappable=False))
    return hits


def substitute_request(
    fields: Fields,
    target: bytes,
    host: str,
    tls: bool,
    by_placeholder: Mapping[bytes, Credential],
    injections: Sequence[Credential],
    now: float = 0.0,
) -> Outcome:
    """Plan the substitution for one request head toward canonical ``host``.

    ``fields`` are the header fields as sent (Proxy-* already removed); ``target`` the request
    target (path and query); ``now`` the time (unix seconds) expiry is judged at. Raises
    nothing: an unreadable or expired secret becomes a refusal. The body is planned apart
    (:class:`BodyResolver`).
    """
    out = Outcome()
    if not by_placeholder and not injections:
        return out
    hits: list[_Hit] = []
    for i, (name, value) in enumerate(fields):
        hits += _header_hits(i, name, value, by_placeholder)
    path, sep, query = target.partition(b"?")
    hits += _target_hits(path, query, by_placeholder)

    swaps: list[_Hit] = []
    for h in hits:  # violations first: any one refuses the request, whatever else it holds
        if not h.credential.bound_to(host):
            out.refuse(h.credential, h.surface, _violation(h.credential, host, h.where))
            return out
    for h in hits:
        c = h.credential
        if not h.swappable or not c.enables(h.surface):
            _misplaced(out, c, h.surface, host, h.where)
            if out.refusal is not None:
                return out
        elif not tls:
            out.refuse(
                c,
                h.surface,
                deny(
                    Reason.CLEARTEXT_CREDENTIAL,
                    f"placeholder of credential {c.name!r} sent over cleartext HTTP; "
                    "credentials are only sent over verified TLS (use https://)",
                ),
            )
            return out
        else:
            swaps.append(h)

    active = [c for c in injections if c.inject and tls and c.bound_to(host)]
    if not swaps and not active:
        return out
    needed = {h.credential.name: h.credential for h in swaps}
    needed.update({c.name: c for c in active})
    values = _values(needed, now, out)
    if values is None:
        return out
    new = list(fields)
    new_query = query
    basic: dict[int, list[tuple[BasicPart | None, bytes, bytes]]] = {}
    for h in swaps:
        secret, _ = values[h.credential.name]
        ph, real = h.credential.placeholder.encode(), secret.reveal()
        if h.surface is Surface.QUERY:
            escaped = bodies.escape(real, "query")
            new_query = _spelled(ph).sub(lambda _, e=escaped: e, new_query)  # type: ignore[misc]
        elif h.surface is Surface.BASIC:
            basic.setdefault(h.index, []).append((h.part, ph, real.encode()))
        else:
            name, value = new[h.index]
            new[h.index] = (name, _replace(value, ph, real.encode()))
    for index, swapped in basic.items():
        new[index] = _swap_basic(new[index], swapped)
    for c in active:
        assert c.inject is not None
        header = c.inject.header.encode("latin-1")
        secret, _ = values[c.name]
        value = c.inject.format.replace("{value}", secret.reveal()).encode()
        new = [(n, v) for n, v in new if n.lower() != header.lower()]
        new.append((header, value))
    out.fields = new
    if new_query != query:
        out.target = path + sep + new_query
    out.used = {name: version for name, (_, version) in values.items()}
    return out


def _replace(text: bytes, ph: bytes, real: bytes) -> bytes:
    """``text`` with each occurrence of ``ph`` that is a placeholder (not followed by a letter or
    digit: ``placeholders.PATTERN``) replaced by ``real``; a longer run is another string."""
    return re.sub(re.escape(ph) + rb"(?![A-Za-z0-9])", lambda _: real, text)


def _swap_basic(
    field_: tuple[bytes, bytes], swaps: list[tuple[BasicPart | None, bytes, bytes]]
) -> tuple[bytes, bytes]:
    """``field_`` (Basic credentials) with each ``(part, placeholder, secret)`` swapped in its part
    only, re-encoded (RFC 7617 §2) under the scheme spelling the client used."""
    name, value = field_
    decoded = _decode_basic(value)
    if decoded is None:
        return field_
    user, password = slots.split_basic(decoded)
    for part, ph, real in swaps:
        if part is BasicPart.USER:
            user = _replace(user, ph, real)
        elif password is not None:
            password = _replace(password, ph, real)
    rebuilt = user if password is None else user + b":" + password
    scheme = value.strip().split(None, 1)[0]
    return name, scheme + b" " + base64.b64encode(rebuilt)


def _values(
    needed: Mapping[str, Credential], now: float, out: Outcome
) -> dict[str, tuple[Secret, int]] | None:
    """The current value and version of each needed credential, or None with ``out.refusal`` set."""
    for c in needed.values():
        if c.expired(now):
            out.refusal = _expired(c)
            return None
    try:
        return {name: c.secret() for name, c in needed.items()}
    except SecretUnavailable as e:  # fail closed: no secret, no request
        out.refusal = _unavailable(sorted(needed))
        out.unavailable = str(e)
        return None


def _expired(c: Credential) -> Decision:
    why = f"credential {c.name!r} expired; ask for a fresh one (nothing was sent)"
    return deny(Reason.CREDENTIAL_EXPIRED, why)


def _unavailable(names: Sequence[str]) -> Decision:
    # The sandbox sees which credential, not where it is kept; the operator's log has it all
    # (Outcome.unavailable, logged by the addon).
    listed = ", ".join(repr(n) for n in names)
    return deny(Reason.CREDENTIAL_UNAVAILABLE, f"credential {listed} is unavailable right now", status=503)


def _violation(cred: Credential, host: str, where: str) -> Decision:
    return deny(
        Reason.PLACEHOLDER_VIOLATION,
        f"placeholder of credential {cred.name!r} in {where} is headed for {host}, "
        "which that credential is not bound to",
    )


class BodyRefused(Exception):
    """A placeholder in a body that must not pass: the connection is to be closed (the request
    head has already left). ``outcome`` holds the refusal, credential and surface."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.refusal.reason.value if outcome.refusal else "refused")
        self.outcome = outcome


class BodyResolver:
    """What each placeholder in one request body becomes: the ``resolve`` callable of
    :class:`proxy.core.bodies.Swapper`.

    ``how`` is the body kind (:func:`proxy.core.bodies.kind`). Each credential's secret is read at
    its first placeholder and kept for the rest of the body. ``outcome`` collects what was used
    and carried (surface ``body``); a refusal raises :class:`BodyRefused`. ``spend`` (optional)
    counts the request against a credential's budget at its first swap in the body and returns
    False when the budget is spent, which refuses the body before the secret is written.
    """

    def __init__(
        self,
        by_placeholder: Mapping[bytes, Credential],
        host: str,
        tls: bool,
        how: str,
        now: float,
        spend: Callable[[Credential], bool] | None = None,
    ) -> None:
        self.by_placeholder, self.host, self.tls, self.how, self.now = by_placeholder, host, tls, how, now
        self.spend = spend
        self.outcome = Outcome()
        self._escaped: dict[str, bytes] = {}

    def may_swap(self, candidates: Iterable[Credential] | None = None) -> bool:
        """True when some credential could be swapped in this body (its length may change).
        ``candidates``: the claim's credentials that enable ``body`` (:attr:`Claim.body`), when
        known, so that this does not walk every credential of the claim."""
        pool = self.by_placeholder.values() if candidates is None else candidates
        return self.tls and any(c.enables(Surface.BODY) and c.bound_to(self.host) for c in pool)

    def may_refuse(self, refusing: bool | None = None) -> bool:
        """True when a placeholder in this body could refuse it (not only be carried);
        ``refusing``: :attr:`Claim.refusing`, when known."""
        if refusing is not None:
            return refusing
        return any(c.on_misplaced is not Misplaced.CARRY for c in self.by_placeholder.values())

    def __call__(self, ph: bytes) -> bytes | None:
        c = self.by_placeholder.get(ph)
        if c is None:
            return None  # placeholder-shaped but not this claim's: not a secret, left alone
        out = self.outcome
        if c.bound_to(self.host) and c.enables(Surface.BODY):
            if c.name in self._escaped:
                return self._escaped[c.name]
            if not self.tls:
                why = (
                    f"placeholder of credential {c.name!r} sent over cleartext HTTP; "
                    "credentials are only sent over verified TLS"
                )
                out.refuse(c, Surface.BODY, deny(Reason.CLEARTEXT_CREDENTIAL, why), terminate=True)
                raise BodyRefused(out)
            values = _values({c.name: c}, self.now, out)
            if values is None:
                out.violated, out.violation_surface, out.terminate = c.name, Surface.BODY.value, True
                raise BodyRefused(out)
            if self.spend is not None and not self.spend(c):
                why = f"credential {c.name!r} has used up its request budget (max_requests)"
                out.refuse(c, Surface.BODY, deny(Reason.CREDENTIAL_BUDGET_SPENT, why), terminate=True)
                raise BodyRefused(out)
            secret, version = values[c.name]
            out.used[c.name] = version
            self._escaped[c.name] = bodies.escape(secret.reveal(), self.how)
            return self._escaped[c.name]
        if c.on_misplaced is Misplaced.CARRY:
            out.carry(c.name, Surface.BODY)
            return None
        if c.bound_to(self.host):
            _misplaced(out, c, Surface.BODY, self.host)
        else:
            out.refuse(c, Surface.BODY, _violation(c, self.host, "the request body"))
        out.terminate = True  # the request head has left: closing is the only refusal left
        raise BodyRefused(out)
