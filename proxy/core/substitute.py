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

Modules: this one plans a request head (:func:`substitute_request`); :mod:`proxy.core.outcome`
holds what was found and decided (:class:`Outcome`) and the refusals every surface shares;
:mod:`proxy.core.headerswap` finds placeholders in header fields, :mod:`proxy.core.basicauth`
reads and rebuilds Basic credentials, :mod:`proxy.core.queryswap` handles the request target, and
:mod:`proxy.core.bodyswap` the body (:class:`BodyResolver`, :class:`BodyRefused`). The names
callers use are importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from proxy.core.basicauth import replace, swap_basic
from proxy.core.bodyswap import BodyRefused, BodyResolver
from proxy.core.decide import Reason, deny
from proxy.core.headerswap import header_hits
from proxy.core.outcome import Hit, Outcome, misplaced, values, violation
from proxy.core.policy import Credential, Surface
from proxy.core.queryswap import swap_query, target_hits
from proxy.core.slots import BasicPart

__all__ = ["BodyRefused", "BodyResolver", "Fields", "Outcome", "substitute_request"]

Fields = Sequence[tuple[bytes, bytes]]


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
    hits: list[Hit] = []
    for i, (name, value) in enumerate(fields):
        hits += header_hits(i, name, value, by_placeholder)
    path, sep, query = target.partition(b"?")
    hits += target_hits(path, query, by_placeholder)

    swaps: list[Hit] = []
    for h in hits:  # violations first: any one refuses the request, whatever else it holds
        if not h.credential.bound_to(host):
            out.refuse(h.credential, h.surface, violation(h.credential, host, h.where))
            return out
    for h in hits:
        c = h.credential
        if not h.swappable or not c.enables(h.surface):
            misplaced(out, c, h.surface, host, h.where)
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
    found = values(needed, now, out)
    if found is None:
        return out
    new = list(fields)
    new_query = query
    basic: dict[int, list[tuple[BasicPart | None, bytes, bytes]]] = {}
    for h in swaps:
        secret, _ = found[h.credential.name]
        ph, real = h.credential.placeholder.encode(), secret.reveal()
        if h.surface is Surface.QUERY:
            new_query = swap_query(new_query, ph, real)
        elif h.surface is Surface.BASIC:
            basic.setdefault(h.index, []).append((h.part, ph, real.encode()))
        else:
            name, value = new[h.index]
            new[h.index] = (name, replace(value, ph, real.encode()))
    for index, swapped in basic.items():
        new[index] = swap_basic(new[index], swapped)
    for c in active:
        assert c.inject is not None
        header = c.inject.header.encode("latin-1")
        secret, _ = found[c.name]
        value = c.inject.format.replace("{value}", secret.reveal()).encode()
        new = [(n, v) for n, v in new if n.lower() != header.lower()]
        new.append((header, value))
    out.fields = new
    if new_query != query:
        out.target = path + sep + new_query
    out.used = {name: version for name, (_, version) in found.items()}
    return out
