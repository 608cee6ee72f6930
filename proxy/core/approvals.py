"""Approvals, the pure part (issue 16): the scopes an operator may choose, and what a grant covers.

Scopes (``POST /approvals/{id}/approve {"scope": ...}``, ``surrogate approvals approve --scope``):

- ``once``: this request only; no grant is kept;
- ``session``: a grant for the claim's session: until this proxy process stops or the claim's
  token is rotated, or it is deleted (the session id is ``<node run id>:<claim version>:<claim
  creation time>``: a claim made again under its id is another session), decided because a
  sandbox's client opens a new connection per request (curl), so "this connection" would be
  useless;
- ``for:DURATION``: a grant until now + DURATION (``30s``, ``10m``, ``2h``, ``1d``; at most
  :data:`MAX_FOR_SECONDS`); the canonical spelling is ``for:SECONDS`` (``for:600``);
- ``always``: a grant until revoked.

A grant covers exactly the approved request's claim, host, port and method, the paths at or
below the approved request's canonical path (segment-wise, :meth:`proxy.core.paths.RequestPath.within`;
never the query), and at most the credentials that request carried: a grant never widens to
another claim, host, method, sibling path or credential (scope creep, docs/threat-model.md).

A grant is made only from a path with exactly one reading (:func:`grantable`); any other is
approved ``once`` only (review r-approve). An ambiguous path's canonical reading is ``/`` (a
dot segment, an encoded slash: :mod:`proxy.core.paths`), so its grant would cover every path of
the host; ``/send//x`` or ``/send/x;p`` would grant ``/send/x``, which a server that keeps
empty segments or parameters reads as another resource than the one the operator saw.

A request may name its method twice (an override header, a ``_method`` parameter:
:mod:`proxy.core.methods`), and many servers act on the other one: a ``GET`` carrying
``X-HTTP-Method-Override: POST`` is a POST to them. Decided: every reading counts (a rule asks
when any reading is one of its ``methods``), and a request with more than one reading is
approved ``once`` only and no standing grant covers it (a grant is for one method). A ``POST``
with a body, under a rule whose ``methods`` leave POST out, may carry ``_method`` in the body:
that body is read first (up to :data:`proxy.core.preview.BODY_BOUND`) and asks when it names
``_method`` (:func:`proxy.core.methods.body_names_method`); one that cannot be read first (no
declared length, longer, or content-encoded) asks (when in doubt, an operator looks).

Errors: ValueError with a sentence naming the scope and what would be right.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.core.paths import canonical_path

SCOPES = ("once", "session", "for", "always")
MAX_FOR_SECONDS = 30 * 24 * 3600
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FOR = re.compile(r"for:([0-9]{1,9})([smhd]?)")


def parse_scope(text: str, offered: tuple[str, ...] = SCOPES) -> tuple[str, int | None]:
    """``(kind, seconds)`` of a scope (seconds only for ``for``). ValueError for a malformed
    scope, a duration of 0 or past :data:`MAX_FOR_SECONDS`, or a kind not in ``offered``."""
    if not isinstance(text, str):
        raise ValueError("scope must be a string: once, session, for:DURATION (10m) or always")
    seconds: int | None = None
    if m := _FOR.fullmatch(text):
        kind, seconds = "for", int(m[1]) * _UNITS[m[2] or "s"]
        if not 0 < seconds <= MAX_FOR_SECONDS:
            raise ValueError(f"scope {text!r}: a duration from 1s to {MAX_FOR_SECONDS // 86400}d")
    elif text in ("once", "session", "always"):
        kind = text
    else:
        raise ValueError(f"scope {text!r} is not one of: once, session, for:DURATION (e.g. for:10m), always")
    if kind not in offered:
        raise ValueError(
            f"scope {kind!r} is not offered by this approval's rule (offered: {', '.join(offered)})"
        )
    return kind, seconds


def canonical_scope(text: str, offered: tuple[str, ...] = SCOPES) -> str:
    """The stored spelling of a scope: ``once``, ``session``, ``for:SECONDS``, ``always``."""
    kind, seconds = parse_scope(text, offered)
    return f"for:{seconds}" if kind == "for" else kind


def check_scopes(items: object) -> tuple[str, ...]:
    """The offered scope kinds of a rule, checked: a non-empty list of SCOPES without repeats."""
    if not isinstance(items, list | tuple) or not items or not all(isinstance(i, str) for i in items):
        raise ValueError(f"scopes must be a non-empty list of: {', '.join(SCOPES)}")
    if bad := [i for i in items if i not in SCOPES]:
        raise ValueError(f"unknown scope {bad[0]!r}; expected some of: {', '.join(SCOPES)}")
    if len(set(items)) != len(items):
        raise ValueError("scopes lists a scope twice")
    return tuple(s for s in SCOPES if s in items)


def grantable(path: str) -> bool:
    """Whether an approval of request target ``path`` may become a standing grant: the path is
    absolute, unambiguous and has one reading (see the module docstring)."""
    where = canonical_path(path)
    return where.absolute and where.ambiguity is None and len(where.readings) == 1


def offered(path: str, scopes: tuple[str, ...], one_method: bool = True) -> tuple[str, ...]:
    """The scopes an approval of ``path`` offers: the rule's ``scopes``, or only ``once`` when
    the path is not :func:`grantable` or the request has more than one method reading
    (``one_method`` False): narrower than any rule's choice, so always safe."""
    return scopes if one_method and grantable(path) else ("once",)


DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class Ask:
    """An egress rule's ``approve:``: the requests it allows only once an operator approves them.
    ``methods`` empty means any; ``paths`` are segment-aware prefixes (as the rule's own);
    ``timeout`` the seconds a request is held before ``approval_timeout``; ``scopes`` offered."""

    methods: frozenset[str] = frozenset()
    paths: tuple[str, ...] = ("/",)
    timeout: float = DEFAULT_TIMEOUT
    scopes: tuple[str, ...] = SCOPES

    def asks(self, method: str, path: str, readings: Iterable[str] = ()) -> bool:
        """Does a request (its method as sent, its target) need an approval under this rule?
        Its path is matched as a catch (:meth:`proxy.core.paths.RequestPath.reaches`): any
        reading under a prefix asks, an ambiguous path asks (when in doubt, an operator looks).
        Methods compare case-insensitively here, though methods are case-sensitive (RFC 9110
        §9.1): an upstream that upper-cases ``post`` must not get a POST nobody approved.
        ``readings``: more methods a server may take it for (:func:`proxy.core.methods.method_readings`)."""
        if self.methods and not ({method.upper(), *(m.upper() for m in readings)} & self.methods):
            return False
        return self.reaches(path)

    def reaches(self, path: str) -> bool:
        """Is ``path`` under one of the rule's ``paths`` (any method)?"""
        where = canonical_path(path)
        return any(where.reaches(p) for p in self.paths)

    def body_may_ask(self, method: str) -> bool:
        """A ``POST`` whose body may name another method (``_method``) one of ``methods`` holds,
        while POST itself is not one of them (module docstring)."""
        return bool(self.methods) and method.upper() == "POST" and "POST" not in self.methods


NOTIFY_DEFAULT_TIMEOUT = 5.0
NOTIFY_MAX_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Notify:
    """The rules file's top-level ``approvals: {notify: [...], timeout: ...}``: a command (no
    shell; the program an executable file) run once per new pending approval with a JSON
    document on its stdin (``addons/notify.py``), killed after ``timeout`` seconds."""

    command: tuple[str, ...]
    timeout: float = NOTIFY_DEFAULT_TIMEOUT
