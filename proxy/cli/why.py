"""``surrogate audit why``: one audited request, found by its id, explained from the rules in force.

    surrogate audit why REQUEST_ID --audit-file FILE --rules FILE [--state-dir DIR] [--json]

:func:`find_event` finds the event in the audit file or its rotated backups; :func:`why` replays
it through :func:`proxy.cli.explain.explain` and says whether the rules in force decide as the
proxy did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy import audit
from proxy.cli.dryrun import Claims, loaded_claims, url_host
from proxy.cli.explain import Explanation, explain, explain_connect, render, to_json
from proxy.core.decide import Reason
from proxy.store.registry import Registry

# Decided by the egress rules (host, port, scheme, method, path): a replay repeats them exactly.
EGRESS = frozenset({
    Reason.ALLOWED, Reason.NO_RULE, Reason.PORT_NOT_ALLOWED, Reason.SCHEME_NOT_ALLOWED,
    Reason.METHOD_NOT_ALLOWED, Reason.PATH_NOT_ALLOWED, Reason.AMBIGUOUS_PATH,
})  # fmt: skip

# Every other reason: where in the proxy it is decided, and what that step checked. None of them
# can be replayed from an audit event (header values, bodies, counters, timing and the network
# are not in it); what the egress rules say about the same request is still shown.
_BY_STAGE: dict[str, dict[Reason, str]] = {
    "identification": {
        Reason.PROXY_AUTH_REQUIRED: "the proxy credential was missing or wrong",
        Reason.UNKNOWN_SOURCE: "the source address belongs to no claim (transparent mode)",
        Reason.WRONG_INTERFACE: "the connection arrived on another interface than its claim's",
        Reason.STORE_STALE: "the node's copy of the fleet store was past its staleness bound",
        Reason.STORE_NEVER_SYNCED: "the node had not yet read the fleet store since it started",
    },
    "request checks": {
        Reason.AUTHORITY_MISMATCH: "the CONNECT host, SNI, Host header or target authority disagreed",
        Reason.BAD_REQUEST_HEAD: "the request line or a header is one no HTTP/1 request may hold",
        Reason.BAD_REQUEST_BODY: "the request body could not be checked (encoding or chunk framing)",
        Reason.NOT_HTTP: "the bytes inside the tunnel were not HTTP; nothing was relayed",
    },
    "internal": {
        Reason.INTERNAL_ERROR: "a check failed unexpectedly; the request was refused, not passed",
    },
    "limits": {
        Reason.TOO_MANY_CONNECTIONS: "the claim already held its pool's limits.connections",
        Reason.RATE_LIMITED: "the claim was over its pool's limits.requests_per_second and burst",
        Reason.HOOK_POOL_LIMIT: "the pool already ran its limits.hook_processes hook commands",
        Reason.HOOK_NODE_LIMIT: "the node already ran --hook-processes hook commands",
    },
    "substitution": {
        Reason.PLACEHOLDER_VIOLATION: "a placeholder was headed for a host its credential is not bound to",
        Reason.CLEARTEXT_CREDENTIAL: "a placeholder was sent over plain http://, where no secret goes",
        Reason.FORGED_PLACEHOLDER: "a placeholder with surrogate's checksum that the claim does not hold",
        Reason.PLACEHOLDER_MISPLACED: "a placeholder on a surface its credential does not enable",
        Reason.CREDENTIAL_EXPIRED: "the credential's expires_at had passed",
        Reason.CREDENTIAL_BUDGET_SPENT: "the credential's max_requests were used up (counted in the store)",
        Reason.CREDENTIAL_UNAVAILABLE: "the credential's value source could not be read then",
    },
    "signing and minting": {
        Reason.TOKEN_MINT_FAILED: "the oauth_client credential's token endpoint gave no access token",
        Reason.SIGV4_BAD_SIGNATURE: "the SigV4 signature was not made with the placeholder secret key",
        Reason.SIGV4_SCOPE_REFUSED: "the SigV4 region or service is outside the credential's allowed set",
        Reason.SIGV4_UNSIGNED: "the request to an aws_sigv4 host carried no SigV4 signature",
        Reason.SIGV4_WRONG_KEY: "the SigV4 access key id was not the claim's placeholder for that host",
        Reason.SIGV4_MALFORMED: "the SigV4 signature or its body could not be read (or was too large)",
        Reason.SIGV4_BAD_CHUNK: "an aws-chunked chunk's signature did not chain on the placeholder's",
    },
    "connecting": {
        Reason.UNRESOLVABLE: "the destination name did not resolve",
        Reason.SPECIAL_ADDRESS: "the name resolved to a special-purpose address not in allow_cidrs",
        Reason.OWN_LISTENER: "the destination was one of surrogate's own listeners, or a loop",
        Reason.UPSTREAM_ERROR: "the upstream could not be reached, or its TLS did not verify",
    },
    "response": {
        Reason.CLIENT_CLOSED: "the client hung up: after the last whole event of a stream, or mid-response",
        Reason.UNSCANNABLE_RESPONSE: "the response body could not be scanned for secrets: not passed",
    },
    "approval": {
        Reason.APPROVAL_DENIED: "an operator denied the held request (or the rules in force then refused it)",
        Reason.APPROVAL_TIMEOUT: "nobody approved the held request before its ask rule's timeout",
        Reason.APPROVAL_LIMIT: "the claim already had limits.approvals requests waiting for approval",
    },
    "hook route": {
        Reason.HOOK_ANSWERED: "a hook route's command answered; the upstream was not contacted",
        Reason.HOOK_TIMEOUT: "the hook route's command ran past its timeout",
        Reason.HOOK_FAILED: "the hook route's command failed or printed no HTTP response",
    },
}
STAGES = {r: (stage, said) for stage, rows in _BY_STAGE.items() for r, said in rows.items()}
# Reached only once the egress rules allowed the request: the replay must allow it too.
_AFTER_STAGES = ("substitution", "signing and minting", "connecting", "response", "hook route", "approval")
_AFTER_EGRESS = {r.value for r, (stage, _) in STAGES.items() if stage in _AFTER_STAGES}
_AFTER_EGRESS |= {Reason.HOOK_POOL_LIMIT.value, Reason.HOOK_NODE_LIMIT.value}  # a hook route matched
_EGRESS = {r.value for r in EGRESS}
NOT_IN_EVENT = (
    "an audit event holds no header value, body, counter, clock or network answer of that "
    "moment, so this step cannot be replayed"
)


def stage_of(reason: str) -> tuple[str, str]:
    """Where the proxy decides ``reason`` and what that step checked (an unknown reason, say from
    a newer release, is said to be decided outside the egress rules)."""
    if reason in EGRESS:
        return "egress rules", "decided by the egress rules (host, port, scheme, method, path)"
    try:
        return STAGES[Reason(reason)]
    except (ValueError, KeyError):
        return "outside the egress rules", f"reason {reason!r} is not one this version knows"


@dataclass(frozen=True, slots=True)
class Why:
    """An audit event replayed: the explanation (None when nothing can be replayed), what can be
    said about it, and whether the rules in force decide as they did (None: not comparable)."""

    event: dict[str, Any]
    explanation: Explanation | None
    notes: tuple[str, ...]
    agrees: bool | None

    @property
    def refused(self) -> bool:
        return self.event.get(audit.DECISION) not in (None, "allow")

    @property
    def stage(self) -> tuple[str, str] | None:
        """Where the event was decided and what that step checked; None for a control event."""
        if self.event.get(audit.EVENT) == "control":
            return None
        return stage_of(str(self.event.get(audit.REASON)))

    @property
    def outside_egress(self) -> bool:
        """Decided by a step a replay of the egress rules cannot repeat."""
        return self.stage is not None and self.event.get(audit.REASON) not in _EGRESS


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
            url = f"{event.get(audit.SCHEME)}://{url_host(host)}:{port}{path}"
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
    except ValueError as e:  # e.g. the claim is gone from the rules (and the store, if read)
        if isinstance(claims, Registry):  # the store was read: the claim is gone from both
            return Why(event, None, (f"cannot replay: {e}",), False)
        note = f"cannot replay: {e}; whether the rules in force decide as the proxy did is not known"
        return Why(event, None, (note,), None)
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
    """The event, where it was decided, and what the rules in force say about it now. A request
    refused outside the egress rules is never shown as allowed: the replay's last word is what the
    egress rules say, beside the step that refused it."""
    e, stage = w.event, w.stage
    lines = [f"audit event {e.get(audit.REQUEST_ID)}:", json.dumps(e, indent=2, ensure_ascii=False), ""]
    if w.refused:
        lines.append(f"refused: {e.get(audit.DECISION)} {e.get(audit.REASON)}: {e.get(audit.MESSAGE)}")
        lines.append(f"rule: {e.get(audit.RULE) or 'none'}")
    if stage is not None and w.outside_egress:
        lines.append(f"decided at: {stage[0]}: {stage[1]}")
    if len(lines) > 3:
        lines.append("")
    if w.explanation is not None:
        heading = (
            "the egress rules in force, replayed:" if w.outside_egress else "the rules in force, replayed:"
        )
        lines += [heading, render(w.explanation, egress_only=w.outside_egress)]
    lines += [f"note: {n}" for n in w.notes]
    done = "refused" if w.refused else "handled"
    if w.agrees is True and not w.outside_egress:
        lines.append("the rules in force decide as the proxy did")
    elif w.agrees is True and stage is not None:
        lines.append(
            f"the egress rules in force allow this request, as they did then; the proxy {done} it at "
            f"{stage[0]} ({e.get(audit.REASON)}): {NOT_IN_EVENT}"
        )
    elif w.agrees is False:
        lines.append(
            "the rules in force decide differently from this event (the rules or the store have "
            "changed since, or the proxy ran with other rules)"
        )
    elif w.explanation is not None and stage is not None:
        lines.append(
            f"the proxy {done} this request at {stage[0]} ({e.get(audit.REASON)}), outside the "
            f"egress rules: {NOT_IN_EVENT}; the replay shows only what the egress rules say about "
            "the same request"
        )
    return "\n".join(lines)


def why_json(w: Why) -> dict[str, Any]:
    """The event, its ``stage`` (``{"name", "checked"}``; null for a control event), whether it
    was decided ``outside_egress`` (then ``explanation`` is only what the egress rules in force
    say, never the proxy's verdict), the replay and the notes."""
    stage = w.stage
    return {
        "event": w.event,
        "stage": {"name": stage[0], "checked": stage[1]} if stage else None,
        "outside_egress": w.outside_egress,
        "explanation": to_json(w.explanation) if w.explanation is not None else None,
        "notes": list(w.notes),
        "agrees": w.agrees,
    }


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
    with loaded_claims(args.rules, args.state_dir) as claims:
        w = why(claims, event, time.time())
    print(json.dumps(why_json(w), indent=2, ensure_ascii=False) if args.json else render_why(w))
    return 0
