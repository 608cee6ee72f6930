"""A pool's parts, built from their models: egress rules, hook routes and limits.

Each builder records every problem it finds in :class:`proxy.rules.marks.Marks` at the field's
location and returns None (or the defaults, for limits) rather than stopping: the loader goes on
to the next part, so one run reports every problem of a file. Host patterns parse; ports are
1..65535; methods are upper-case tokens (RFC 9110 §5.6.2); path prefixes have one canonical
reading (:mod:`proxy.core.paths`); a hook's program is an executable file.
"""

from __future__ import annotations

import os
from pathlib import Path

from proxy.core import hooks
from proxy.core.approvals import MAX_TIMEOUT as MAX_ASK_TIMEOUT
from proxy.core.approvals import Ask, check_scopes
from proxy.core.errors import HostError
from proxy.core.hosts import HostPattern
from proxy.core.limits import MAX_WEBSOCKET_MESSAGE as MAX_WS_MESSAGE
from proxy.core.limits import MIN_WEBSOCKET_MESSAGE as MIN_WS_MESSAGE
from proxy.core.limits import Limits
from proxy.core.paths import prefix_problem
from proxy.core.policy import EgressRule
from proxy.rules.marks import Loc, Marks
from proxy.rules.models import TOKEN, HookModel, LimitsModel, RuleModel


def build_rule(pool: str, i: int, rm: RuleModel, loc: Loc, marks: Marks) -> EgressRule | None:
    ok = True
    try:
        host = HostPattern.parse(rm.host)
    except HostError as e:
        marks.add(loc + ("host",), str(e))
        ok = False
    for j, port in enumerate(rm.ports):
        if not 1 <= port <= 65535:
            marks.add(loc + ("ports", j), f"port {port} is outside 1..65535")
            ok = False
    for j, method in enumerate(rm.methods):
        if not TOKEN.match(method) or method != method.upper():
            marks.add(loc + ("methods", j), f"method {method!r} must be an upper-case token like GET")
            ok = False
    for j, prefix in enumerate(rm.paths):
        if (problem := prefix_problem(prefix)) is not None:  # one canonical reading (proxy.core.paths)
            marks.add(loc + ("paths", j), f"path prefix {prefix!r} {problem}")
            ok = False
    if rm.scheme == "http" and not rm.intercept:
        marks.add(
            loc + ("scheme",),
            "scheme: http never opens a tunnel, so it cannot be intercept: false (an opaque "
            "tunnel is a CONNECT: scheme https)",
        )
        ok = False
    ask = build_ask(rm, loc + ("approve",), marks) if rm.approve is not None else None
    if not ok or (rm.approve is not None and ask is None):
        return None
    return EgressRule(
        f"{pool}.egress[{i}]",
        host,
        frozenset(rm.ports),
        frozenset(rm.methods),
        tuple(rm.paths),
        rm.intercept,
        rm.report,
        scheme=rm.scheme,
        approve=ask,
    )


def build_ask(rm: RuleModel, loc: Loc, marks: Marks) -> Ask | None:
    """An egress rule's ``approve`` (:class:`proxy.core.approvals.Ask`); None when wrong (said)."""
    am = rm.approve
    assert am is not None
    n = len(marks.problems)
    if not rm.intercept:
        marks.add(loc, "approve needs intercept: true (an opaque tunnel's requests are never seen)")
    for j, method in enumerate(am.methods):
        if not TOKEN.match(method) or method != method.upper():
            marks.add(loc + ("methods", j), f"method {method!r} must be an upper-case token like POST")
    for j, prefix in enumerate(am.paths):
        if (problem := prefix_problem(prefix)) is not None:
            marks.add(loc + ("paths", j), f"path prefix {prefix!r} {problem}")
    if not 0 < am.timeout <= MAX_ASK_TIMEOUT:
        why = f"timeout {am.timeout} must be more than 0 and at most {MAX_ASK_TIMEOUT:g} seconds"
        marks.add(loc + ("timeout",), why)
    scopes: tuple[str, ...] = ()
    try:
        scopes = check_scopes(am.scopes)
    except ValueError as e:
        marks.add(loc + ("scopes",), str(e))
    if len(marks.problems) > n:
        return None
    return Ask(frozenset(am.methods), tuple(am.paths), float(am.timeout), scopes)


def build_hook(
    pool: str, i: int, hm: HookModel, loc: Loc, base_dir: Path, marks: Marks
) -> hooks.HookRoute | None:
    """A hook route; its command's program must exist and be executable (a relative path is taken
    from the rules file's folder)."""
    n = len(marks.problems)
    try:
        host = HostPattern.parse(hm.host)
    except HostError as e:
        marks.add(loc + ("host",), str(e))
    for j, method in enumerate(hm.methods):
        if not TOKEN.match(method) or method != method.upper():
            marks.add(loc + ("methods", j), f"method {method!r} must be an upper-case token like POST")
    for j, prefix in enumerate(hm.paths):
        if (problem := prefix_problem(prefix)) is not None:
            marks.add(loc + ("paths", j), f"path prefix {prefix!r} {problem}")
    if not 0 < hm.timeout <= 300:
        marks.add(loc + ("timeout",), f"timeout {hm.timeout} must be more than 0 and at most 300 seconds")
    program = ""
    if not hm.command or not hm.command[0]:
        marks.add(loc + ("command",), "command must be a non-empty list: the program, then its arguments")
    else:
        program = str(base_dir / os.path.expanduser(hm.command[0]))
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            marks.add(
                loc + ("command", 0),
                f"program {program!r} is not an executable file (give a path; commands run without a shell)",
            )
    if len(marks.problems) > n:
        return None
    return hooks.HookRoute(
        f"{pool}.hooks[{i}]",
        host,
        frozenset(hm.methods),
        tuple(hm.paths),
        (program, *hm.command[1:]),
        float(hm.timeout),
    )


def build_limits(lm: LimitsModel, loc: Loc, marks: Marks) -> Limits:
    if lm.connections < 1:
        marks.add(loc + ("connections",), f"connections {lm.connections} must be at least 1")
    if not lm.requests_per_second > 0 or lm.requests_per_second == float("inf"):
        marks.add(
            loc + ("requests_per_second",),
            f"requests_per_second {lm.requests_per_second} must be a positive number, e.g. 50 or 0.5",
        )
    if lm.burst < 1:
        marks.add(loc + ("burst",), f"burst {lm.burst} must be at least 1")
    if lm.hook_processes < 1:
        marks.add(loc + ("hook_processes",), f"hook_processes {lm.hook_processes} must be at least 1")
    ws = lm.websocket_message_bytes
    if not MIN_WS_MESSAGE <= ws <= MAX_WS_MESSAGE:
        why = f"websocket_message_bytes {ws} must be from {MIN_WS_MESSAGE} to {MAX_WS_MESSAGE}"
        marks.add(loc + ("websocket_message_bytes",), why)
    if lm.approvals < 1:
        marks.add(loc + ("approvals",), f"approvals {lm.approvals} must be at least 1")
    return Limits(
        lm.connections, lm.requests_per_second, lm.burst, lm.hook_processes, websocket_message=ws,
        approvals=lm.approvals,
    )  # fmt: skip


def coverage_rule(pool: str, i: int, rm: RuleModel) -> EgressRule | None:
    """A rule whose ports, methods or paths are wrong, reduced to what decides whether it covers
    a credential host (its host, scheme and ``intercept``), so a claim's hosts are still checked
    in the same run; None when one of those is wrong too (its problem is already said)."""
    try:
        host = HostPattern.parse(rm.host)
    except HostError:
        return None
    if rm.scheme == "http" and not rm.intercept:
        return None
    return EgressRule(
        f"{pool}.egress[{i}]", host, frozenset(), frozenset(), ("/",), rm.intercept, scheme=rm.scheme
    )
