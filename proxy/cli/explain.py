"""Dry runs for operators: what the proxy would decide for a request, and why an audited one
ended as it did.

    surrogate rules explain --rules FILE --claim ID [--state-dir DIR] [--json]
                            METHOD URL [-H 'Name: value']...
    surrogate audit why REQUEST_ID --audit-file FILE --rules FILE [--state-dir DIR] [--json]

:func:`explain` walks one request through the core calls the proxy's addons make, in their order
and with their arguments (explicit-proxy mode, as curl or git send it):

1. ``https``: the CONNECT is decided by :func:`decide_connect` on the canonical host and port. An
   allowing ``intercept: false`` rule makes an opaque tunnel, whose requests surrogate never sees.
2. The request is decided by :func:`decide_request`, ``intercepted_only`` inside a tunnel (as
   addons/policy.py sets it), after the Host header agreement check when a Host header is given.
3. An allowed request goes through :func:`substitute_request` (``tls`` for https); a refusal
   keeps the rule that allowed the host, as addons/substitute.py does.

It never touches the network and never reads a secret: each credential reaches the core with a
stand-in source whose value is ``<secret:NAME>``, so the planned header fields show which header
each credential would land in, and only credential and header names are reported. What a dry
run cannot know is said in its notes: whether a secret's source is readable right now (503
``credential_unavailable``), name resolution and address checks, the upstream's answer, and
transparent-mode identification by source address.

:func:`why` finds one audit event by its request id and replays it against the rules in force.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from proxy import audit
from proxy.core import placeholders
from proxy.core.decide import Decision, Reason, check_path, decide_connect, decide_request, deny
from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host, split_authority
from proxy.core.paths import canonical_path
from proxy.core.policy import Claim, Policy
from proxy.core.secrets import Secret
from proxy.core.substitute import substitute_request
from proxy.rules.loader import load_rules
from proxy.store.registry import Registry
from proxy.store.sqlite import open_state_store

Claims = Policy | Registry

NOT_REPLAYED = (
    "not replayed: name resolution and the address checks made when connecting "
    "(unresolvable, own_listener, special_address), and the upstream's answer"
)


@dataclass(frozen=True, slots=True)
class Placement:
    """A credential the request would carry: ``how`` is swapped, swapped in Basic, or injected."""

    credential: str
    header: str
    how: str


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


@dataclass(frozen=True, slots=True)
class _StandIn:
    """A value source that reads nothing: its value names the credential."""

    name: str

    def current(self) -> tuple[Secret, int]:
        return Secret(_marker(self.name)), 0


def _marker(name: str) -> str:
    return f"<secret:{name}>"


def _stand_in(claim: Claim) -> Claim:
    """``claim`` with every credential's source replaced by a stand-in (same index shape)."""
    creds = tuple(dataclasses.replace(c, source=_StandIn(c.name)) for c in claim.credentials)
    return Claim.build(claim.id, claim.pool, claim.proxy_token, creds, claim.origin, claim.sources)


def _lookup(claims: Claims, claim_id: str) -> tuple[Claim, Policy]:
    if isinstance(claims, Registry):
        claim, policy = claims.claim(claim_id), claims.policy
    else:
        claim, policy = claims.claims.get(claim_id), claims
    if claim is None:
        known = ", ".join(sorted(policy.claims)) or "none"
        store = "" if isinstance(claims, Registry) else "; pass --state-dir for control-API claims"
        raise ValueError(f"no claim {claim_id!r} (claims in {policy.source}: {known}{store})")
    return claim, policy


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` → ``("Name", "value")``, as curl's ``-H`` reads it."""
    name, sep, value = text.partition(":")
    if not sep or not name or name != name.strip():
        raise ValueError(f"header {text!r} is not 'Name: value'")
    return name, value.strip()


def _authority(headers: Sequence[tuple[str, str]], host: str, port: int) -> Decision | None:
    """The proxy's refusal when a given Host header names another host or port, else None."""
    value = next((v for n, v in headers if n.lower() == "host"), None)
    if value is None:  # clients send the URL's authority; explain assumes they agree
        return None
    try:
        name, given_port = split_authority(value)
    except HostError as e:
        return deny(Reason.AUTHORITY_MISMATCH, str(e), status=400)
    if name != host or (given_port is not None and given_port != port):
        message = f"Host header {value!r} does not match the tunnel's host {host}:{port}"
        return deny(Reason.AUTHORITY_MISMATCH, message, status=421)
    return None


def _basic(value: bytes) -> bytes | None:
    parts = value.split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    try:
        return base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None


def _placements(fields: Sequence[tuple[bytes, bytes]], used: Sequence[str], claim: Claim) -> list[Placement]:
    """Where each used credential's stand-in value landed in the planned header fields."""
    creds = {c.name: c for c in claim.credentials}
    out: list[Placement] = []
    for raw_name, value in fields:
        header = raw_name.decode("latin-1")
        decoded = _basic(value) if header.lower() == "authorization" else None
        for name in used:
            mark, inject = _marker(name).encode(), creds[name].inject
            if mark in value and inject is not None and inject.header.lower() == header.lower():
                how = f"injected (format {inject.format!r})"  # an injection replaces the header
            elif mark in value:
                how = "swapped"
            elif decoded is not None and mark in decoded:
                how = "swapped in Basic credentials"
            else:
                continue
            out.append(Placement(name, header, how))
    return out


def _unregistered(fields: Sequence[tuple[bytes, bytes]], target: bytes, claim: Claim) -> list[str]:
    notes = []
    for where, value in [*((f"header {n.decode('latin-1')}", v) for n, v in fields), ("the URL", target)]:
        for m in placeholders.find(value):
            if m.group() not in claim.by_placeholder:
                text = m.group().decode()
                notes.append(
                    f"{text} in {where} is not a placeholder of claim {claim.id!r}: it passes as text"
                )
    return notes


def _request_fields(
    headers: Sequence[tuple[str, str]], user: str | None, password: str | None
) -> tuple[list[tuple[bytes, bytes]], list[str]]:
    notes = []
    kept = [(n, v) for n, v in headers if not n.lower().startswith("proxy-")]
    if len(kept) != len(headers):
        notes.append("Proxy-* headers are removed by the proxy before anything else sees them")
    if user is not None and not any(n.lower() == "authorization" for n, _ in kept):
        creds = f"{unquote(user)}:{unquote(password or '')}".encode()
        kept.append(("Authorization", "Basic " + base64.b64encode(creds).decode("ascii")))
        notes.append("the URL's user info is sent as Basic credentials, as curl and git send it")
    return [(n.encode("utf-8"), v.encode("utf-8")) for n, v in kept], notes


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
    claim, policy = _lookup(claims, claim_id)
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
    fields, notes = _request_fields(headers, parts.username, parts.password)
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
    mismatch = _authority(headers, host, port)
    if mismatch is not None:
        return Explanation(**steps, verdict=mismatch, notes=tuple(notes))
    path = canonical_path(target)
    endpoints = [c.oauth.host for c in claim.oauth if c.oauth is not None]
    ambiguous = check_path(pool, host, path, endpoints)
    if ambiguous is not None:  # as addons/policy.py refuses it, before the egress rules
        return Explanation(**steps, verdict=ambiguous, request=ambiguous, notes=tuple(notes))
    request = decide_request(
        pool, host, port, method, path, intercepted_only=tunnelled, scheme=scheme
    )
    if not request.allowed:
        return Explanation(**steps, verdict=request, request=request, notes=tuple(notes))

    proxy_view = _stand_in(claim)
    target_bytes = target.encode("utf-8")
    notes += _unregistered(fields, target_bytes, claim)
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
    placed = _placements(outcome.fields or [], list(outcome.used), proxy_view)
    if placed:
        notes.append(
            "explain reads no secret: whether each credential's source is readable right now "
            "(else 503 credential_unavailable) is not checked"
        )
    return Explanation(
        **steps, verdict=request, request=request, placements=tuple(placed),
        carried=tuple(outcome.carried), notes=tuple(notes),
    )  # fmt: skip


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
    return Explanation(**base, host=host, verdict=connect, connect=connect, tunnel="intercepted")


def explain_connect(claims: Claims, claim_id: str, host: str, port: int) -> Explanation:
    """The CONNECT alone (what an audited ``tunnel`` event records): decided on host and port."""
    claim, policy = _lookup(claims, claim_id)
    base = dict(claim=claim.id, pool=claim.pool, method="CONNECT", scheme="https", port=port, target="")
    exp = _connect(policy, claim, host, port, base, [])
    return dataclasses.replace(exp, event="tunnel")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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


def render(e: Explanation) -> str:
    """The explanation for people: the steps, then the verdict, then what was not checked."""
    target = f"{e.scheme}://{_url_host(e.host)}:{e.port}{e.target}"
    lines = [f"{e.method} {target}  as claim {e.claim} (pool {e.pool})"]
    if e.connect is not None:
        lines.append(f"  CONNECT {_url_host(e.host)}:{e.port}: {_line(e.connect)}")
    if e.tunnel == "intercepted":
        lines.append("  tunnel: intercepted (surrogate terminates TLS; each request is decided again)")
    elif e.tunnel == "opaque":
        lines.append("  tunnel: opaque (intercept: false; TLS passes through untouched)")
    if e.request is not None:
        lines.append(f"  request {e.method} {e.target}: {_line(e.request)}")
    if e.substitution is not None:
        lines.append(f"  substitution: {_line(e.substitution)}")
    for p in e.placements:
        lines.append(f"  credential {p.credential}: {p.how} in header {p.header}")
    if e.carried:
        lines.append(
            f"  carried unchanged (found where its credential is not swapped): {', '.join(e.carried)}"
        )
    shown = e.verdict in (e.connect, e.request, e.substitution)  # its sentence is printed above
    lines.append(f"verdict: {_line(e.verdict, message=not shown)}")
    lines.append(
        f"audited as: event {e.event!r}, decision {e.verdict.action.value}, reason {e.verdict.reason.value}"
    )
    lines += [f"note: {n}" for n in (*e.notes, NOT_REPLAYED)]
    return "\n".join(lines)


# --- audit why ------------------------------------------------------------------------------------

_EGRESS = {
    "allowed",
    "no_rule",
    "port_not_allowed",
    "scheme_not_allowed",
    "method_not_allowed",
    "path_not_allowed",
    "ambiguous_path",
}
# Reached only after the egress rules allowed the request (substitution, resolution, upstream).
_AFTER_EGRESS = {
    "placeholder_violation",
    "placeholder_misplaced",
    "cleartext_credential",
    "credential_expired",
    "credential_unavailable",
    "unresolvable",
    "own_listener",
    "special_address",
    "upstream_error",
    "client_closed",
    "unscannable_response",
    "hook_answered",
    "hook_timeout",
    "hook_failed",
}


@dataclass(frozen=True, slots=True)
class Why:
    """An audit event replayed: the explanation (None when nothing can be replayed), what can be
    said about it, and whether the rules in force decide as they did (None: not comparable)."""

    event: dict[str, Any]
    explanation: Explanation | None
    notes: tuple[str, ...]
    agrees: bool | None


def audit_files(path: Path) -> list[Path]:
    """``path`` and its rotated backups that exist, newest first. ``--audit-max-bytes`` rotates
    through the standard library's RotatingFileHandler, which renames ``PATH`` to ``PATH.1`` and
    each ``PATH.N`` to ``PATH.N+1`` (so ``PATH.1`` is the newest backup)."""
    backups: list[tuple[int, Path]] = []
    prefix = path.name + "."
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit():
                backups.append((int(p.name[len(prefix) :]), p))
    found = [path] if path.exists() else []
    return found + [p for _, p in sorted(backups)]


def _find_in(path: Path, request_id: str) -> dict[str, Any] | None:
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None  # rotated away between listing and opening: the retry in find_event sees it
    with f:
        for line in f:
            if request_id not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written, or not an audit line
            if isinstance(event, dict) and event.get(audit.REQUEST_ID) == request_id:
                return event
    return None


def find_event(path: Path, request_id: str) -> dict[str, Any] | None:
    """The audit event with ``request_id`` in the JSON-lines file ``path`` or in one of its rotated
    backups (``PATH.1`` … ``PATH.K``, see :func:`audit_files`); None: in none of them. A rotation
    while the files are read can move the event past the reader, so a miss is searched once more."""
    for _ in range(2):
        for p in audit_files(path):
            event = _find_in(p, request_id)
            if event is not None:
                return event
    return None


def why(claims: Claims, event: dict[str, Any], now: float | None = None) -> Why:
    """Replay ``event`` against the rules in force (see :func:`explain`)."""
    kind, claim, reason = event.get(audit.EVENT), event.get(audit.CLAIM), event.get(audit.REASON)
    if kind == "control":
        note = (
            f"a control-API mutation ({event.get(audit.ACTION)} by {event.get(audit.WHO)}); "
            "it changed claims or credentials and has no egress decision to explain"
        )
        return Why(event, None, (note,), None)
    if not claim:
        note = (
            f"the request was not identified as any claim ({reason}: {event.get(audit.MESSAGE)}); "
            "without a claim there is no pool whose rules could be replayed"
        )
        return Why(event, None, (note,), None)
    host, port = str(event.get(audit.HOST)), int(event.get(audit.PORT) or 0)
    notes = []
    try:
        if kind == "tunnel":
            exp = explain_connect(claims, claim, host, port)
        else:
            path = str(event.get(audit.PATH) or "/")
            url = f"{event.get(audit.SCHEME)}://{_url_host(host)}:{port}{path}"
            exp = explain(claims, claim, str(event.get(audit.METHOD)), url, now=now)
            if "?" in path:
                notes.append(
                    "explained with the path as logged: query values are REDACTED in the audit log (the "
                    "egress rules ignore the query; placeholders in query values cannot be re-checked)"
                )
            notes.append(
                "header values are never logged, so substitution was replayed without the request's "
                "headers: the event's credentials and carried fields record what happened"
            )
    except ValueError as e:  # e.g. the claim is gone from the rules and the store
        return Why(event, None, (f"cannot replay: {e}",), False)
    return Why(event, exp, tuple(notes), _agrees(event, exp))


def _agrees(event: dict[str, Any], exp: Explanation) -> bool | None:
    reason, rule, egress = event.get(audit.REASON), event.get(audit.RULE), exp.egress
    if reason in _EGRESS:
        opaque = event.get(audit.EVENT) == "tunnel" and reason == "allowed"  # only opaque ones are logged
        if egress is None or (opaque and exp.tunnel != "opaque"):
            return False
        now = (egress.action.value, egress.reason.value, egress.rule.label() if egress.rule else None)
        return now == (event.get(audit.DECISION), reason, rule)
    if reason in _AFTER_EGRESS:  # the egress rules allowed it; resolve's refusals keep no rule
        if egress is None or not egress.allowed:
            return False
        return rule is None or (egress.rule is not None and egress.rule.label() == rule)
    return None  # decided before the egress rules: authentication, Host agreement, internal error


def render_why(w: Why) -> str:
    e = w.event
    lines = [f"audit event {e.get(audit.REQUEST_ID)}:", json.dumps(e, indent=2, ensure_ascii=False), ""]
    if e.get(audit.DECISION) not in (None, "allow"):
        lines.append(f"refused: {e.get(audit.DECISION)} {e.get(audit.REASON)}: {e.get(audit.MESSAGE)}")
        lines.append(f"rule: {e.get(audit.RULE) or 'none'}")
        lines.append("")
    if w.explanation is not None:
        lines += ["the rules in force, replayed:", render(w.explanation)]
    lines += [f"note: {n}" for n in w.notes]
    if w.agrees is True:
        lines.append("the rules in force decide as the proxy did")
    elif w.agrees is False:
        lines.append(
            "the rules in force decide differently from this event (the rules or the store have "
            "changed since, or the proxy ran with other rules)"
        )
    elif w.explanation is not None:
        lines.append(
            f"this event was decided outside the egress rules ({e.get(audit.REASON)}): the replay "
            "shows only what the rules say about the same request"
        )
    return "\n".join(lines)


def why_json(w: Why) -> dict[str, Any]:
    return {
        "event": w.event,
        "explanation": to_json(w.explanation) if w.explanation is not None else None,
        "notes": list(w.notes),
        "agrees": w.agrees,
    }


# --- entry points ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _claims(rules: Path, state_dir: Path | None) -> Iterator[Claims]:
    """The rules file's claims, plus the store's when ``state_dir`` is given (never created)."""
    policy = load_rules(rules)
    if state_dir is None:
        yield policy
        return
    with open_state_store(state_dir, create=False) as store:  # a dry run never creates a store
        registry = Registry(policy, store)
        registry.refresh()
        yield registry


def main_explain(args: argparse.Namespace) -> int:
    """``surrogate rules explain``: args rules, claim, method, url, header (list), state_dir, json."""
    headers = [parse_header(h) for h in args.header or ()]
    with _claims(args.rules, args.state_dir) as claims:
        exp = explain(claims, args.claim, args.method, args.url, headers, time.time())
    print(json.dumps(to_json(exp), indent=2) if args.json else render(exp))
    return 0


def main_why(args: argparse.Namespace) -> int:
    """``surrogate audit why``: args request_id, audit_file, rules, state_dir, json. Exit 1 when
    no event has that id."""
    request_id = args.request_id.strip()
    if not audit_files(args.audit_file):
        print(
            f"surrogate: audit file {args.audit_file} does not exist (nor any rotated {args.audit_file}.N)",
            file=sys.stderr,
        )
        return 1
    event = find_event(args.audit_file, request_id)
    if event is None:
        print(
            f"surrogate: no audit event with request_id {request_id!r} in {args.audit_file}"
            " or its rotated backups",
            file=sys.stderr,
        )
        return 1
    with _claims(args.rules, args.state_dir) as claims:
        w = why(claims, event, time.time())
    print(json.dumps(why_json(w), indent=2, ensure_ascii=False) if args.json else render_why(w))
    return 0
