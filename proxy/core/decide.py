"""Decisions: pure functions from plain facts and the policy to an explained verdict.

Every :class:`Decision` carries an action, a reason code (stable, for machines), a sentence (for
people, never a secret), the rule that decided (or None when no rule did) and the HTTP status a
refusal is answered with. Egress is default-deny: no matching rule, no connection.

Report mode (``report: true`` on a pool, or on a rule) lets operators roll out a stricter policy:
a request the rules would refuse is allowed, and its decision carries ``would_deny`` (the reason
it would have been refused) for the audit event. Placeholder violations and every other check
outside the egress rules are never relaxed by it.

Rules of a pool are tried in file order; the first rule whose host, port, scheme, method and
path all match decides. A CONNECT is decided on host and port alone (the method and path are not
known until the tunnel carries a request), and only ``scheme: https`` rules can allow it: a
port allowed for plain HTTP never becomes a tunnel. Each request inside the tunnel is decided
again in full, on the scheme it arrived with (``http`` when the tunnel carries no TLS); an
``http://`` request toward a port only ``https`` rules allow is refused ``scheme_not_allowed``
before any connection.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from proxy.core.paths import RequestPath, canonical_path, redact
from proxy.core.policy import EgressRule, Pool


class Action(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    VIOLATION = "violation"
    ERROR = "error"


class Reason(StrEnum):
    ALLOWED = "allowed"
    NO_RULE = "no_rule"
    PORT_NOT_ALLOWED = "port_not_allowed"
    SCHEME_NOT_ALLOWED = "scheme_not_allowed"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    PATH_NOT_ALLOWED = "path_not_allowed"
    PROXY_AUTH_REQUIRED = "proxy_auth_required"
    AUTHORITY_MISMATCH = "authority_mismatch"
    PLACEHOLDER_VIOLATION = "placeholder_violation"
    PLACEHOLDER_MISPLACED = "placeholder_misplaced"
    CLEARTEXT_CREDENTIAL = "cleartext_credential"
    CREDENTIAL_UNAVAILABLE = "credential_unavailable"
    CREDENTIAL_EXPIRED = "credential_expired"
    UPSTREAM_ERROR = "upstream_error"
    CLIENT_CLOSED = "client_closed"
    INTERNAL_ERROR = "internal_error"
    OWN_LISTENER = "own_listener"
    UNKNOWN_SOURCE = "unknown_source"
    SPECIAL_ADDRESS = "special_address"
    BAD_REQUEST_HEAD = "bad_request_head"
    BAD_REQUEST_BODY = "bad_request_body"
    UNRESOLVABLE = "unresolvable"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    RATE_LIMITED = "rate_limited"
    FORGED_PLACEHOLDER = "forged_placeholder"
    CREDENTIAL_BUDGET_SPENT = "credential_budget_spent"
    UNSCANNABLE_RESPONSE = "unscannable_response"
    HOOK_ANSWERED = "hook_answered"
    HOOK_TIMEOUT = "hook_timeout"
    HOOK_FAILED = "hook_failed"
    AMBIGUOUS_PATH = "ambiguous_path"
    HOOK_POOL_LIMIT = "hook_pool_limit"
    HOOK_NODE_LIMIT = "hook_node_limit"
    WRONG_INTERFACE = "wrong_interface"
    NOT_HTTP = "not_http"
    STORE_STALE = "store_stale"  # the fleet store's copy is past its staleness bound (issue 14)
    STORE_NEVER_SYNCED = "store_never_synced"  # the fleet store was never read since the start
    TOKEN_MINT_FAILED = "token_mint_failed"  # noqa: S105 (a reason code, not a password); oauth_client: no access token (proxy.core.mint)
    # SigV4 re-signing (proxy.core.sigv4)
    SIGV4_BAD_SIGNATURE = "sigv4_bad_signature"
    SIGV4_SCOPE_REFUSED = "sigv4_scope_refused"
    SIGV4_UNSIGNED = "sigv4_unsigned"
    SIGV4_WRONG_KEY = "sigv4_wrong_key"
    SIGV4_MALFORMED = "sigv4_malformed"
    SIGV4_BAD_CHUNK = "sigv4_bad_chunk"
    # approvals (issue 16, addons/approve.py)
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"
    APPROVAL_LIMIT = "approval_limit"  # the claim already has limits.approvals requests held


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason
    message: str
    rule: EgressRule | None = None
    status: int = 200
    would_deny: Reason | None = None  # report mode: what the rules would have refused

    @property
    def allowed(self) -> bool:
        return self.action is Action.ALLOW


def deny(reason: Reason, message: str, status: int = 403, rule: EgressRule | None = None) -> Decision:
    action = Action.VIOLATION if reason in _VIOLATIONS else Action.DENY
    if reason in (
        Reason.CREDENTIAL_UNAVAILABLE,
        Reason.UPSTREAM_ERROR,
        Reason.INTERNAL_ERROR,
        Reason.UNRESOLVABLE,
        Reason.HOOK_TIMEOUT,
        Reason.HOOK_FAILED,
        Reason.STORE_STALE,
        Reason.STORE_NEVER_SYNCED,
    ):
        action = Action.ERROR
    return Decision(action, reason, message, rule, status)


_VIOLATIONS = frozenset(
    {
        Reason.PLACEHOLDER_VIOLATION,
        Reason.CLEARTEXT_CREDENTIAL,
        Reason.FORGED_PLACEHOLDER,
        Reason.SIGV4_WRONG_KEY,
    }
)


def path_matches(prefix: str, path: str) -> bool:
    """Segment-aware prefix match of the request target ``path`` (its query ignored) against a
    configured ``prefix``: ``/repos`` matches ``/repos``, ``/repos/`` and ``/repos/x``, not
    ``/reposx``; every reading of the path must be inside the prefix, and under any prefix but
    ``/`` an ambiguous path never matches (:meth:`proxy.core.paths.RequestPath.within`)."""
    return canonical_path(path).within(prefix)


# How far a rule got before it failed, so the refusal names the closest reason.
_PROGRESS = (
    Reason.NO_RULE,
    Reason.PORT_NOT_ALLOWED,
    Reason.SCHEME_NOT_ALLOWED,
    Reason.METHOD_NOT_ALLOWED,
    Reason.PATH_NOT_ALLOWED,
)


def decide_connect(pool: Pool, host: str, port: int) -> Decision:
    """Decide a CONNECT (or the start of a transparent TLS connection) to canonical
    ``host``:``port``: only ``scheme: https`` rules open tunnels."""
    best, closest = 0, None
    for rule in pool.egress:
        if not rule.host.matches(host):
            continue
        if rule.ports and port not in rule.ports:
            best, closest = max(best, 1), closest or rule
            continue
        if rule.scheme != "https":
            best, closest = 2, rule if best < 2 else closest
            continue
        return Decision(Action.ALLOW, Reason.ALLOWED, f"allowed by {rule.label()}", rule)
    return _report_or_refuse(
        pool, closest, _refusal(pool, host, port, best, scheme="a tunnel (scheme: https)")
    )


def decide_request(
    pool: Pool,
    host: str,
    port: int,
    method: str,
    path: str | RequestPath,
    intercepted_only: bool = False,
    scheme: str = "https",
    also: Iterable[str] = (),
) -> Decision:
    """Decide one request; ``path`` is the request target as sent (its query is ignored) or its
    :class:`proxy.core.paths.RequestPath`, whose every reading a rule's path prefix must cover
    (:meth:`RequestPath.within`; an ambiguous path only ``/``).

    ``intercepted_only``: the request came through a tunnel whose TLS surrogate terminated, so
    only intercepting rules may allow it. ``scheme``: ``https`` when the request reached surrogate
    over TLS or names ``https://`` (it leaves over TLS), else ``http``. ``also``: the other
    methods a server may read the request as (:mod:`proxy.core.methods`): a rule's ``methods``
    must list them all.
    """
    ident = canonical_path(path) if isinstance(path, str) else path
    others = frozenset(also)
    best, closest = 0, None
    for rule in pool.egress:
        if not rule.host.matches(host) or (intercepted_only and not rule.intercept):
            continue
        if rule.ports and port not in rule.ports:
            progress = 1
        elif rule.scheme != scheme:
            progress = 2
        elif rule.methods and (method not in rule.methods or not others <= rule.methods):
            progress = 3
        elif not any(ident.within(p) for p in rule.paths):
            progress = 4
        else:
            return Decision(Action.ALLOW, Reason.ALLOWED, f"allowed by {rule.label()}", rule)
        if progress > best or closest is None:
            best, closest = max(best, progress), rule
    shown = redact(ident.canonical if ident.ambiguity is None else ident.target.split("?", 1)[0])
    if others:  # named as sent only when a plain word: the values are the sandbox's
        named = sorted(m for m in others if m.isascii() and m.isalpha() and len(m) <= 20)[:5]
        method = f"{method} (also read as {', '.join(named) or 'another method'})"
    return _report_or_refuse(pool, closest, _refusal(pool, host, port, best, method, shown, scheme + "://"))


def check_path(
    pool: Pool, host: str, path: RequestPath, endpoint_hosts: Iterable[str] = ()
) -> Decision | None:
    """400 ``ambiguous_path`` when ``path`` is ambiguous (:mod:`proxy.core.paths`) and anything on
    canonical ``host`` matches on paths: an egress rule or hook route of ``pool`` for the host
    with a path prefix other than ``/``, or a token endpoint on it (``endpoint_hosts``: the
    hosts of the claim's OAuth token endpoints). None: nothing to refuse. Never relaxed by
    report mode. The message does not quote the path.
    """
    if path.ambiguity is None:
        return None
    sensitive = (
        any(r.host.matches(host) and any(p != "/" for p in r.paths) for r in pool.egress)
        or any(h.host.matches(host) and any(p != "/" for p in h.paths) for h in pool.hooks)
        or host in endpoint_hosts
    )
    if not sensitive:
        return None
    return deny(
        Reason.AMBIGUOUS_PATH,
        f"the request path holds {path.ambiguity}, which servers read as different paths, and "
        f"{host} has rules, hook routes or token endpoints that match on paths; send the path "
        "spelled plainly (RFC 3986 §6.2.2)",
        status=400,
    )


def _report_or_refuse(pool: Pool, closest: EgressRule | None, refusal: Decision) -> Decision:
    """Report mode (the pool's, or that of the rule that came closest): allow, and carry what
    would have been refused so the audit event can say ``would_deny``."""
    if pool.report or (closest is not None and closest.report):
        rule = closest if closest is not None and closest.report else None
        return Decision(
            Action.ALLOW,
            Reason.ALLOWED,
            f"report mode: allowed, but {refusal.message}",
            rule,
            would_deny=refusal.reason,
        )
    return refusal


def _refusal(
    pool: Pool, host: str, port: int, best: int, method: str = "", path: str = "", scheme: str = ""
) -> Decision:
    reason = _PROGRESS[best]
    what = {
        Reason.NO_RULE: f"no egress rule of pool {pool.name!r} allows host {host}",
        Reason.PORT_NOT_ALLOWED: f"no egress rule of pool {pool.name!r} allows port {port} on {host}",
        Reason.SCHEME_NOT_ALLOWED: f"no egress rule of pool {pool.name!r} allows {scheme} to {host}:{port}",
        Reason.METHOD_NOT_ALLOWED: f"no egress rule of pool {pool.name!r} allows {method} to {host}",
        Reason.PATH_NOT_ALLOWED: f"no egress rule of pool {pool.name!r} allows path {path} on {host}",
    }[reason]
    return deny(reason, what)
