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
