"""``surrogate rules explain``: what the proxy would decide for a request, offline.

    surrogate rules explain --rules FILE --claim ID [--state-dir DIR] [--json]
                            METHOD URL [-H 'Name: value']...

:func:`explain` walks one request through the core calls the proxy's addons make, in their order
and with their arguments (explicit-proxy mode, as curl or git send it):

1. ``https``: the CONNECT is decided by :func:`decide_connect` on the canonical host and port. An
   allowing ``intercept: false`` rule makes an opaque tunnel, whose requests surrogate never sees.
2. The request is decided by :func:`decide_request`, ``intercepted_only`` inside a tunnel (as
   addons/policy.py sets it), after the Host header agreement check when a Host header is given.
3. An allowed request goes through :func:`substitute_request` (``tls`` for https); a refusal
   keeps the rule that allowed the host, as addons/substitute.py does.

It never touches the network and never reads a secret: each credential reaches the core with a
stand-in source whose value is ``<secret:NAME>`` (:mod:`proxy.cli.dryrun`), so the planned header
fields show which header each credential would land in, and only credential and header names are
reported. What a dry run cannot know is said in its notes: whether a secret's source is readable
right now (503 ``credential_unavailable``), name resolution and address checks, the upstream's
answer, and transparent-mode identification by source address.

``surrogate audit why`` (:mod:`proxy.cli.why`) replays audited events through :func:`explain`.

Exit status of ``rules explain`` (:data:`EXIT_HELP`), so scripts can branch on the verdict: 0
allow (an opaque tunnel and report mode's ``would_deny`` included: the proxy lets it through), 3
deny, 4 violation, 5 error (the proxy could not process it: a claim whose pool is not defined);
1 when the input cannot be explained (the rules file does not load, an unknown claim, a URL or
header that is not one), 2 a usage error (argparse), as for every ``surrogate`` command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy import audit
from proxy._moved import forward
from proxy.cli.dryrun import (
    Claims,
    Placement,
    authority_refusal,
    loaded_claims,
    lookup,
    parse_header,
    placements,
    request_fields,
    stand_in,
    unregistered,
    url_host,
)
from proxy.cli.options import EXPLAIN_EXIT_HELP
from proxy.core import placeholders
from proxy.core.decide import Action, Decision, Reason, check_path, decide_connect, decide_request, deny
from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host
from proxy.core.paths import canonical_path
from proxy.core.policy import Claim, Policy
from proxy.core.substitute import substitute_request

__all__ = ["EXIT", "EXIT_HELP", "Explanation", "Placement", "explain", "explain_connect", "main_explain"]
__all__ += ["parse_header"]
__all__ += ["render", "to_json"]

# ``audit why`` lived here before it had a module of its own: its names still import from here.
__getattr__ = forward("proxy.cli.why")

EXIT = {Action.ALLOW: 0, Action.DENY: 3, Action.VIOLATION: 4, Action.ERROR: 5}  # by the verdict
EXIT_INPUT, EXIT_USAGE = 1, 2
EXIT_HELP = EXPLAIN_EXIT_HELP  # in proxy.cli.options: the parser shows it without this module

NOT_REPLAYED = (
    "not replayed: name resolution and the address checks made when connecting "
    "(unresolvable, own_listener, special_address), and the upstream's answer"
)


@dataclass(frozen=True, slots=True)
class Explanation:
    """One dry run. ``verdict`` is what the proxy answers and audits; the other decisions are the
    steps that led there (None: not reached)."""

    claim: str
    pool: str
    method: str
    scheme: str
    host: str  # canonical
    port: int
    target: str  # path and query as sent ("" for a CONNECT alone)
    event: str  # the audit event it produces: "request" or "tunnel"
    verdict: Decision
    connect: Decision | None = None
    tunnel: str | None = None  # "intercepted" or "opaque", once a CONNECT is allowed
    request: Decision | None = None
    substitution: Decision | None = None  # a refusal of the substitution step
    placements: tuple[Placement, ...] = ()
    carried: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def egress(self) -> Decision | None:
        """The egress rules' last word: the request's decision, else the CONNECT's."""
        return self.request if self.request is not None else self.connect


def explain(
    claims: Claims,
    claim_id: str,
    method: str,
    url: str,
    headers: Sequence[tuple[str, str]] = (),
    now: float | None = None,
) -> Explanation:
    """What the proxy would do with ``method url`` (with ``headers``) sent by claim ``claim_id``.

    ``claims`` is a loaded rules file, or a Registry that also holds the store's claims. ``now``
    (unix seconds, default the clock) judges credential expiry. Raises ValueError for an unknown
    claim or a URL that is not ``http://`` or ``https://`` with a host.
    """
    claim, policy = lookup(claims, claim_id)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    try:
        port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None
    if not 0 < port < 65536:
        raise ValueError(f"{url!r} has an invalid port")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    fields, notes = request_fields(headers, parts.username, parts.password)
    if method != method.upper():
        notes.append(f"methods are case-sensitive (RFC 9110 §9.1): {method!r} is not {method.upper()!r}")
    base: dict[str, Any] = dict(claim=claim.id, pool=claim.pool, method=method, scheme=scheme, port=port)
    tunnelled = scheme == "https"
    if tunnelled:
        first = _connect(policy, claim, parts.hostname, port, dict(base, target=target), notes)
        if first.tunnel != "intercepted":  # refused, or an opaque tunnel: the CONNECT is the story
            return first
        host, connect, tunnel = first.host, first.connect, first.tunnel
    else:
        connect = tunnel = None
        try:
            host = canonical_host(parts.hostname)  # policy refuses a bad request host as a mismatch
        except HostError as e:
            refusal = deny(Reason.AUTHORITY_MISMATCH, str(e), status=400)
            return Explanation(
                **base,
                host=parts.hostname,
                target=target,
                event="request",
                verdict=refusal,
                notes=tuple(notes),
            )
    pool = policy.pools.get(claim.pool)
    steps: dict[str, Any] = dict(
        base, host=host, target=target, event="request", connect=connect, tunnel=tunnel
    )
    if pool is None:
        return Explanation(**steps, verdict=_no_pool(claim, notes), notes=tuple(notes))
    mismatch = authority_refusal(headers, host, port)
    if mismatch is not None:
        return Explanation(**steps, verdict=mismatch, notes=tuple(notes))
    path = canonical_path(target)
    endpoints = [c.oauth.host for c in claim.oauth if c.oauth is not None]
    ambiguous = check_path(pool, host, path, endpoints)
    if ambiguous is not None:  # as addons/policy.py refuses it, before the egress rules
        return Explanation(**steps, verdict=ambiguous, request=ambiguous, notes=tuple(notes))
    request = decide_request(pool, host, port, method, path, intercepted_only=tunnelled, scheme=scheme)
    if not request.allowed:
        return Explanation(**steps, verdict=request, request=request, notes=tuple(notes))

    ask = request.rule.approve if request.rule is not None else None
    if ask is not None and ask.asks(method, target):  # addons/approve.py holds it
        notes.append(
            f"asks for approval: rule {request.rule.id if request.rule else ''} holds this request "
            f"until an operator approves it (timeout {ask.timeout:g} s, scopes {', '.join(ask.scopes)}; "
            "a matching grant lets it through without asking)"
        )
    proxy_view = stand_in(claim)
    target_bytes = target.encode("utf-8")
    notes += unregistered(fields, target_bytes, claim)
    outcome = substitute_request(
        fields,
        target_bytes,
        host,
        tunnelled,
        proxy_view.by_placeholder,
        proxy_view.injections,
        time.time() if now is None else now,
    )
    if outcome.refusal is not None:
        refusal = dataclasses.replace(outcome.refusal, rule=request.rule)
        return Explanation(
            **steps, verdict=refusal, request=request, substitution=refusal, notes=tuple(notes)
        )
    placed = placements(outcome.fields or [], list(outcome.used), proxy_view)
    if placed:
        notes.append(
            "explain reads no secret: whether each credential's source is readable right now "
            "(else 503 credential_unavailable) is not checked (--check-sources reads the rules "
            "file's sources once, when it is loaded)"
        )
    names = {p.credential for p in placed}
    notes += [  # format-valid placeholders (issue 15): which template each one is of
        f"credential {c.name}: its placeholder is of {placeholders.describe(c.placeholder)}"
        for c in claim.credentials
        if c.name in names and placeholders.template_of(c.placeholder) is not None
    ]
    notes += _kinds(claim, host, tunnelled)
    return Explanation(
        **steps, verdict=request, request=request, placements=tuple(placed),
        carried=tuple(outcome.carried), notes=tuple(notes),
    )  # fmt: skip


def _kinds(claim: Claim, host: str, tls: bool) -> list[str]:
    """What credentials of kind oauth_client and hmac would do here (issue 15), never a value."""
    out = []
    for c in claim.credentials:
        if not (tls and c.bound_to(host)):
            continue
        if c.mint is not None:
            out.append(
                f"credential {c.name!r} (kind oauth_client): surrogate mints an access token at "
                f"{c.mint.spec.token_url} (grant {c.mint.spec.grant}) and injects it; if none can be "
                "minted the request is refused 502 token_mint_failed"
            )
        if c.sign is not None:
            parts = " + ".join(c.sign.parts)
            out.append(
                f"credential {c.name!r} (kind hmac): surrogate sets {c.sign.timestamp_header} and "
                f"{c.sign.header} ({c.sign.algorithm}, {c.sign.encoding}, over {parts})"
            )
    return out


def _no_pool(claim: Claim, notes: list[str]) -> Decision:
    """The proxy's lookup of a pool the rules do not define raises, and fail_closed refuses."""
    notes.append(f"claim {claim.id!r} names pool {claim.pool!r}, which the rules file does not define")
    return deny(Reason.INTERNAL_ERROR, "surrogate could not process this request", status=400)


def _connect(
    policy: Policy, claim: Claim, raw_host: str, port: int, base: dict[str, Any], notes: list[str]
) -> Explanation:
    """The CONNECT step. Its ``event`` is "tunnel" when the CONNECT ends the story (refused, or
    an opaque tunnel), else "request" with ``tunnel`` "intercepted"."""
    base = dict(base, event="tunnel")
    try:
        host = canonical_host(raw_host)
    except HostError as e:  # identify refuses a CONNECT host that cannot be canonicalised
        refusal = deny(Reason.NO_RULE, str(e), status=400)
        return Explanation(**base, host=raw_host, verdict=refusal, notes=tuple(notes))
    pool = policy.pools.get(claim.pool)
    if pool is None:
        return Explanation(**base, host=host, verdict=_no_pool(claim, notes), notes=tuple(notes))
    connect = decide_connect(pool, host, port)
    if not connect.allowed:
        return Explanation(**base, host=host, verdict=connect, connect=connect, notes=tuple(notes))
    if connect.rule is not None and not connect.rule.intercept:
        notes.append(
            "the tunnel is opaque: surrogate never sees the requests inside it (method, path and "
            "headers are not checked) and no credential can apply; placeholders pass as they are"
        )
        return Explanation(
            **base, host=host, verdict=connect, connect=connect, tunnel="opaque", notes=tuple(notes)
        )
    base["event"] = "request"
    for c in claim.credentials:  # kind aws_sigv4: signed, not swapped (addons/sigv4.py)
        if c.sigv4 is not None and c.bound_to(host):
            a = c.sigv4.allowed
            notes.append(
                f"credential {c.name} (kind aws_sigv4): a request signed with its placeholder keys is "
                "verified and re-signed with the real key, for regions "
                f"{', '.join(sorted(a.regions))} and services {', '.join(sorted(a.services))}"
            )
    return Explanation(**base, host=host, verdict=connect, connect=connect, tunnel="intercepted")


def explain_connect(claims: Claims, claim_id: str, host: str, port: int) -> Explanation:
    """The CONNECT alone (what an audited ``tunnel`` event records): decided on host and port."""
    claim, policy = lookup(claims, claim_id)
    base = dict(claim=claim.id, pool=claim.pool, method="CONNECT", scheme="https", port=port, target="")
    exp = _connect(policy, claim, host, port, base, [])
    return dataclasses.replace(exp, event="tunnel")


# --- output --------------------------------------------------------------------------------------


def _decision_json(d: Decision | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "decision": d.action.value,
        "reason": d.reason.value,
        "rule": d.rule.label() if d.rule else None,
        "message": None if d.allowed else d.message,
        "status": None if d.allowed else d.status,
    }


def to_json(e: Explanation) -> dict[str, Any]:
    """The explanation as JSON; the verdict's fields use the audit event's names."""
    verdict = _decision_json(e.verdict)
    assert verdict is not None
    return {
        audit.CLAIM: e.claim,
        audit.POOL: e.pool,
        audit.METHOD: e.method,
        audit.SCHEME: e.scheme,
        audit.HOST: e.host,
        audit.PORT: e.port,
        audit.PATH: e.target or None,
        audit.EVENT: e.event,
        **verdict,
        "connect": _decision_json(e.connect),
        "tunnel": e.tunnel,
        "request": _decision_json(e.request),
        "substitution": _decision_json(e.substitution),
        audit.CREDENTIALS: [{"name": p.credential, "header": p.header, "how": p.how} for p in e.placements],
        audit.CARRIED: list(e.carried),
        "notes": list(e.notes),
    }


def _line(d: Decision, message: bool = True) -> str:
    rule = d.rule.label() if d.rule else "none"
    if d.allowed:
        return f"allow (rule {rule})"
    said = f": {d.message}" if message else ""
    return f"{d.action.value} {d.reason.value}, status {d.status} (rule {rule}){said}"


def render(e: Explanation, egress_only: bool = False) -> str:
    """The explanation for people: the steps, then the verdict, then what was not checked.

    ``egress_only``: the replay of a request the proxy decided for a reason the replay cannot
    repeat (``audit why``): only the egress steps, and a last line that says what the egress rules
    say, never a verdict."""
    target = f"{e.scheme}://{url_host(e.host)}:{e.port}{e.target}"
    lines = [f"{e.method} {target}  as claim {e.claim} (pool {e.pool})"]
    if e.connect is not None:
        lines.append(f"  CONNECT {url_host(e.host)}:{e.port}: {_line(e.connect)}")
    if e.tunnel == "intercepted":
        lines.append("  tunnel: intercepted (surrogate terminates TLS; each request is decided again)")
    elif e.tunnel == "opaque":
        lines.append("  tunnel: opaque (intercept: false; TLS passes through untouched)")
    if e.request is not None:
        lines.append(f"  request {e.method} {e.target}: {_line(e.request)}")
    if e.substitution is not None and not egress_only:
        lines.append(f"  substitution: {_line(e.substitution)}")
    for p in () if egress_only else e.placements:  # the refusal came before any substitution
        lines.append(f"  credential {p.credential}: {p.how} in header {p.header}")
    if e.carried and not egress_only:
        lines.append(
            f"  carried unchanged (found where its credential is not swapped): {', '.join(e.carried)}"
        )
    shown = e.verdict in (e.connect, e.request, e.substitution)  # its sentence is printed above
    if egress_only:
        said = e.egress or e.verdict  # a refusal before the egress rules (a bad host) has no step
        lines.append(f"the egress rules in force: {_line(said, message=said not in (e.connect, e.request))}")
    else:
        lines.append(f"verdict: {_line(e.verdict, message=not shown)}")
        lines.append(
            f"audited as: event {e.event!r}, decision {e.verdict.action.value}, "
            f"reason {e.verdict.reason.value}"
        )
    lines += [f"note: {n}" for n in (*e.notes, NOT_REPLAYED)]
    return "\n".join(lines)


def main_explain(args: argparse.Namespace) -> int:
    """``surrogate rules explain``: args rules, claim, method, url, header (list), state_dir, json,
    check_sources. Returns the exit status of the verdict (:data:`EXIT`); raises ValueError or
    :class:`proxy.core.errors.SurrogateError` for input that cannot be explained (exit 1)."""
    headers = [parse_header(h) for h in args.header or ()]
    with loaded_claims(args.rules, args.state_dir, getattr(args, "check_sources", False)) as claims:
        exp = explain(claims, args.claim, args.method, args.url, headers, time.time())
    print(json.dumps(to_json(exp), indent=2) if args.json else render(exp))
    return EXIT[exp.verdict.action]
