"""Rules that are valid and still risky: host checks shared by the loader and the control API.

:func:`credential_host_risk` says why a secret must not be bound to a host pattern (an error in
a rules file, ``422 risky_host`` at the control API); :func:`opaque_shadow` finds the opaque rule
that would tunnel a credential host before any intercepting one; :func:`find_warnings` collects the
warnings of a loaded file (the file loads; ``rules check`` and ``run`` print them).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from proxy.core import slots
from proxy.core.errors import HostError, Problem
from proxy.core.hosts import HostPattern
from proxy.core.policy import EgressRule, Pool
from proxy.core.suffixes import confusable, internal, wildcard_risk
from proxy.rules.marks import Loc, Marks, rule_loc
from proxy.rules.models import CredentialModel

if TYPE_CHECKING:
    from proxy.rules.shape import Shape


def credential_host_risk(pattern: HostPattern) -> str | None:
    """Why a secret must not be bound to ``pattern`` (issue 13): ``*`` (every host: the widest
    wildcard over public suffixes), a wildcard that spans a public or shared-tenant suffix, or a
    confusable IDN label (:mod:`proxy.core.suffixes`); None if none. The control API refuses the same
    hosts. A pool's ``unsafe_any_host`` lets it *connect* anywhere; it never makes ``*`` a
    credential host."""
    if pattern.any_host:
        return "'*' spans every public suffix (Public Suffix List): it sends the secret to every host"
    if pattern.suffix is not None and (why := wildcard_risk(pattern.suffix.lstrip("."))) is not None:
        return why
    return confusable(pattern.suffix.lstrip(".") if pattern.suffix else pattern.text)


def opaque_shadow(pool: Pool, host: HostPattern) -> EgressRule | None:
    """The first rule that could decide a CONNECT to ``host``, when it is non-intercepting and
    comes before any intercepting rule covering ``host`` (rules are tried in order)."""
    for rule in pool.egress:
        if rule.scheme != "https":
            continue  # never decides a CONNECT
        if rule.intercept and rule.host.covers(host):
            return None
        if not rule.intercept and (
            rule.host.covers(host) or host.covers(rule.host) or rule.host.matches(str(host).lstrip("*."))
        ):
            return rule
    return None


def find_warnings(shape: Shape, pools: dict[str, Pool], marks: Marks) -> list[Problem]:
    """Risky but valid: '*' in a pool whose claims hold credentials, wildcards over shared-hosting
    suffixes, rules an earlier rule overlaps so that order decides (for CONNECT, the first
    host-and-port match picks interception or an opaque tunnel), port 80 under scheme https
    (likely meant as plain HTTP), and header slots that hosts commonly reflect
    (proxy.core.slots.REFLECTED). Found in every section whose shape is right, whether or not
    the file has errors elsewhere."""
    before = len(marks.problems)
    credentialed = {c.model.pool for c in shape.claims if c and c.model and c.credentials}
    for name, pool in pools.items():
        for i, rule in enumerate(pool.egress):
            at = rule_loc(rule.id)
            loc: Loc = (*at, "host")
            if rule.host.any_host and name in credentialed and pool.unsafe_any_host:
                message = "'*' allows any host in a pool whose claims hold credentials (unsafe_any_host)"
                marks.add(loc, message)
            if rule.scheme == "https" and 80 in rule.ports:
                marks.add(
                    (*at, "ports"),
                    "port 80 under scheme https (the default) allows only a CONNECT there: for "
                    "plain http:// requests write a rule with 'scheme: http'",
                )
            suffix = (rule.host.suffix or "").lstrip(".")
            if suffix and (why := wildcard_risk(suffix)) is not None:
                marks.add(loc, f"*.{suffix} spans a public or shared-hosting suffix: {why}")
            if not rule.host.any_host and (why := confusable(suffix or rule.host.text)) is not None:
                marks.add(loc, f"{rule.host}: {why}")
            for earlier in pool.egress[:i] if rule.scheme == "https" else ():
                if earlier.scheme != "https":
                    continue  # a scheme: http rule never decides a CONNECT
                ports_overlap = not earlier.ports or not rule.ports or bool(earlier.ports & rule.ports)
                if earlier.host.covers(rule.host) and ports_overlap and earlier.intercept != rule.intercept:
                    marks.add(
                        loc,
                        f"{earlier.label()} comes first and covers {rule.host}: a CONNECT there is "
                        f"{'intercepted' if earlier.intercept else 'an opaque tunnel'} "
                        "whatever this rule says",
                    )
    for ci, cs in enumerate(shape.claims):
        for ki, km in enumerate(cs.credentials if cs else ()):
            if km is not None:
                _credential_warnings(km, ("claims", ci, "credentials", ki), marks)
    found = marks.problems[before:]
    del marks.problems[before:]
    return [dataclasses.replace(p, severity="warning") for p in found]


def _credential_warnings(km: CredentialModel, loc: Loc, marks: Marks) -> None:
    """Addresses and internal names as credential hosts; header slots hosts commonly reflect."""
    for j, raw in enumerate(km.hosts):
        try:
            pattern = HostPattern.parse(raw)
        except HostError:
            continue
        name = (pattern.suffix or "").lstrip(".") or pattern.text
        if not pattern.any_host and (why := internal(name)) is not None:
            marks.add(loc + ("hosts", j), f"credential host {pattern}: {why}")
    for j, header in enumerate(km.headers or ()):
        if header.lower() in slots.REFLECTED:
            marks.add(
                loc + ("headers", j),
                f"{header} is a header hosts commonly reflect: a secret swapped there may come back",
            )
