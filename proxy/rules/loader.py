"""Rules files: YAML (``version: 1``) parsed by pydantic at the edge, validated completely, and
turned into a frozen :class:`proxy.core.policy.Policy`.

Every problem found is reported at once, each with file, line, column and the dotted field, e.g.
``rules/example.yaml:14:15: claims[0].credentials[0].hosts[0]: host api.example.com is not
covered by an intercepting egress rule of pool 'demo'``. Nothing starts with a file that has a
problem: :func:`load_rules` raises :class:`proxy.core.errors.RulesError`.

Checks beyond the shape: host patterns parse; ports are 1..65535; methods are upper-case
tokens; paths start with ``/``; each claim names an existing pool; claim ids, credential names
(per claim) and placeholders (across the file) are unique; placeholders have the recognisable
format; value sources are ``env:``/``file:`` and readable now; every credential host is covered by
an intercepting egress rule of the claim's pool; an injection's format contains ``{value}`` and
its header is not ``Host`` or ``Proxy-*``. A secret value never appears in a message.

The parts, one module each: :mod:`~proxy.rules.models` (the pydantic shape),
:mod:`~proxy.rules.marks` (lines, columns and the problem list), :mod:`~proxy.rules.pools` and
:mod:`~proxy.rules.claims` (the builders), :mod:`~proxy.rules.risks` (host risks and warnings).
The fields are documented in ``rules/README.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from pydantic import ValidationError

from proxy.core.errors import Problem, RulesError
from proxy.core.policy import Claim, Credential, EgressRule, Network, Policy, Pool, SourceToken
from proxy.rules.claims import bind_interface, build_credential, networks, value_source
from proxy.rules.marks import Loc, Marks, pydantic_problems
from proxy.rules.models import (
    ClaimModel,
    CredentialModel,
    HookModel,
    InjectModel,
    LimitsModel,
    PoolModel,
    RuleModel,
    RulesModel,
)
from proxy.rules.pools import build_hook, build_limits, build_rule
from proxy.rules.risks import credential_host_risk, find_warnings, opaque_shadow

__all__ = [  # the names of this module before it was split, still imported from here
    "ClaimModel",
    "CredentialModel",
    "HookModel",
    "InjectModel",
    "LimitsModel",
    "Loc",
    "PoolModel",
    "RuleModel",
    "RulesModel",
    "credential_host_risk",
    "load_rules",
    "opaque_shadow",
]


def load_rules(path: str | Path) -> Policy:
    """Load and fully validate the rules file at ``path``.

    Raises RulesError listing every problem (file, line, column, field, message).
    """
    path = Path(path)
    file = str(path)
    marks = Marks(file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise RulesError([Problem(file, None, None, "", f"cannot read rules file: {why}")]) from None
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                marks.walk(node)  # before constructing: aliases are refused, not expanded
            if marks.problems:
                raise RulesError(marks.sorted())
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = getattr(e, "problem", None) or str(e)
        raise RulesError([Problem(file, line, col, "", f"invalid YAML: {problem}")]) from None
    if node is None or not isinstance(data, dict):
        raise RulesError([Problem(file, 1, 1, "", "expected a mapping with 'version: 1' and 'pools'")])
    try:
        model = RulesModel.model_validate(data)
    except ValidationError as e:
        pydantic_problems(e, marks)
        raise RulesError(marks.sorted()) from None
    policy = _build(model, path.parent.resolve(), marks)
    if marks.problems:
        raise RulesError(marks.sorted())
    return policy


def _build(model: RulesModel, base_dir: Path, marks: Marks) -> Policy:
    pools: dict[str, Pool] = {}
    broken: set[str] = set()  # pools with a rule in error: coverage checks would mislead
    for pname, pm in model.pools.items():
        rules: list[EgressRule] = []
        for i, rm in enumerate(pm.egress):
            rule = build_rule(pname, i, rm, ("pools", pname, "egress", i), marks)
            if rule is not None:
                rules.append(rule)
            else:
                broken.add(pname)
        allow = networks(pm.allow_cidrs, ("pools", pname, "allow_cidrs"), marks, {}, pname)
        limits = build_limits(pm.limits, ("pools", pname, "limits"), marks)
        pools[pname] = Pool(
            pname, tuple(rules), pm.allow_reroute, allow, pm.report, limits, pm.unsafe_any_host
        )
        routes = [
            build_hook(pname, i, hm, ("pools", pname, "hooks", i), base_dir, marks)
            for i, hm in enumerate(pm.hooks)
        ]
        if routes:
            pools[pname] = dataclasses.replace(pools[pname], hooks=tuple(r for r in routes if r is not None))

    claims: dict[str, Claim] = {}
    seen_placeholders: dict[str, str] = {}
    owners: dict[Network, str] = {}
    for ci, cm in enumerate(model.claims):
        loc: Loc = ("claims", ci)
        if cm.id in claims:
            marks.add(loc + ("id",), f"duplicate claim id {cm.id!r}")
        pool = pools.get(cm.pool)
        if pool is None:
            known = ", ".join(sorted(pools)) or "(none defined)"
            marks.add(loc + ("pool",), f"unknown pool {cm.pool!r}; defined pools: {known}")
        token = value_source(cm.proxy_token, base_dir, loc + ("proxy_token",), marks)
        creds: list[Credential] = []
        names: set[str] = set()
        for ki, km in enumerate(cm.credentials):
            kloc = loc + ("credentials", ki)
            if km.name in names:
                marks.add(kloc + ("name",), f"duplicate credential name {km.name!r} in claim {cm.id!r}")
            names.add(km.name)
            covering = None if cm.pool in broken else pool
            cred = build_credential(km, kloc, covering, base_dir, marks, seen_placeholders, cm.id)
            if cred is not None:
                creds.append(cred)
        if token is not None:
            sources = networks(cm.sources, loc + ("sources",), marks, owners, cm.id)
            claim = Claim.build(cm.id, cm.pool, SourceToken(token), tuple(creds), "rules", sources)
            claims[cm.id] = bind_interface(claim, cm, loc, marks)
    for pname, pool in pools.items():
        holder = next((c.id for c in claims.values() if c.pool == pname and c.credentials), None)
        wide = pool.any_host_rule()
        if holder is not None and wide is not None:
            i = pool.egress.index(wide)
            marks.add(
                ("pools", pname, "egress", i, "host"),
                f"'*' allows any host, and claim {holder!r} of this pool holds credentials: list the "
                "hosts the pool may reach, or set 'unsafe_any_host: true' on the pool",
            )
    warnings = find_warnings(model, pools, claims, marks)
    return Policy(marks.file, pools, claims, tuple(warnings))
