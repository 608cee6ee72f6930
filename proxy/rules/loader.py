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

from proxy.core.errors import Problem, RulesError
from proxy.core.policy import Claim, Credential, EgressRule, Network, Policy, Pool, SourceToken
from proxy.rules.approvals import build_notify
from proxy.rules.claims import bind_interface, build_credential, networks, value_source
from proxy.rules.marks import Loc, Marks, rule_loc
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
from proxy.rules.pools import build_hook, build_limits, build_rule, coverage_rule
from proxy.rules.risks import credential_host_risk, find_warnings, opaque_shadow
from proxy.rules.shape import Shape, shape

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


def load_rules(path: str | Path, *, read_secrets: bool = True) -> Policy:
    """Load and fully validate the rules file at ``path``.

    ``read_secrets`` (the default, as ``run`` and a reload need) also reads every value source
    now and refuses the file when one cannot be read; without it the sources are only parsed
    (``rules check`` and ``rules explain`` by default: checking a file needs no secret on the
    machine). Raises RulesError listing every problem (file, line, column, field, message), and
    the file's warnings with them.
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
            if marks.alias_seen:  # a duplicate key is said and the last value checked on
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
    policy = _build(shape(data, marks), path.parent.resolve(), marks, read_secrets)
    if marks.problems:
        raise RulesError(marks.sorted(), list(policy.warnings))
    return policy


def _build(sh: Shape, base_dir: Path, marks: Marks, read: bool) -> Policy:
    pools, covering = _pools(sh, base_dir, marks)
    claims: dict[str, Claim] = {}
    ids: set[str] = set()
    seen_placeholders: dict[str, str] = {}
    owners: dict[Network, str] = {}
    for ci, cs in enumerate(sh.claims):
        if cs is None:
            continue
        loc: Loc = ("claims", ci)
        cm = cs.model
        pool = None
        if cm is not None:
            if cm.id in ids:
                marks.add(loc + ("id",), f"duplicate claim id {cm.id!r}")
            ids.add(cm.id)
            pool = pools.get(cm.pool)
            if pool is None and sh.pools_known and cm.pool not in sh.pools:
                known = ", ".join(sorted(sh.pools)) or "(none defined)"
                marks.add(loc + ("pool",), f"unknown pool {cm.pool!r}; defined pools: {known}")
        claim_id = cm.id if cm is not None else f"claims[{ci}]"
        token = (
            None
            if cm is None
            else value_source(cm.proxy_token, base_dir, loc + ("proxy_token",), marks, read)
        )
        creds: list[Credential] = []
        names: set[str] = set()
        for ki, km in enumerate(cs.credentials):
            kloc = loc + ("credentials", ki)
            if km is None:
                continue
            if km.name in names:
                marks.add(kloc + ("name",), f"duplicate credential name {km.name!r} in claim {claim_id!r}")
            names.add(km.name)
            cover = covering.get(cm.pool) if cm is not None else None
            cred = build_credential(km, kloc, cover, base_dir, marks, seen_placeholders, claim_id, read)
            if cred is not None:
                creds.append(cred)
        if cm is None:
            continue
        sources = networks(cm.sources, loc + ("sources",), marks, owners, cm.id)
        bound = bind_interface(cm, loc, marks)
        if token is not None:
            claim = Claim.build(cm.id, cm.pool, SourceToken(token), tuple(creds), "rules", sources)
            claims[cm.id] = dataclasses.replace(claim, interface=bound) if bound else claim
    _any_host(sh, pools, marks)
    warnings = find_warnings(sh, pools, marks)
    notify = build_notify(sh.approvals, ("approvals",), base_dir, marks) if sh.approvals else None
    return Policy(marks.file, pools, claims, tuple(warnings), notify)


def _pools(sh: Shape, base_dir: Path, marks: Marks) -> tuple[dict[str, Pool], dict[str, Pool]]:
    """The pools, and for each the pool that judges whether a credential host is covered: its
    rules, a wrong one reduced to its host, scheme and ``intercept``
    (:func:`~proxy.rules.pools.coverage_rule`). A pool with a rule whose host is wrong has none:
    a host that rule covers would be said uncovered."""
    pools: dict[str, Pool] = {}
    covering: dict[str, Pool] = {}
    for pname, ps in sh.pools.items():
        loc: Loc = ("pools", pname)
        pm = ps.model or PoolModel()  # its own fields are wrong (said): the defaults, to go on
        rules: list[EgressRule] = []
        cover: list[EgressRule] = []
        for i, rm in enumerate(ps.egress):
            rule = None if rm is None else build_rule(pname, i, rm, loc + ("egress", i), marks)
            if rule is not None:
                rules.append(rule)
            if rm is not None and (stand := rule or coverage_rule(pname, i, rm)) is not None:
                cover.append(stand)
        allow = networks(pm.allow_cidrs, loc + ("allow_cidrs",), marks, {}, pname)
        limits = build_limits(pm.limits, loc + ("limits",), marks)
        routes = [
            build_hook(pname, i, hm, loc + ("hooks", i), base_dir, marks)
            for i, hm in enumerate(ps.hooks)
            if hm is not None
        ]
        pool = Pool(
            pname,
            tuple(rules),
            pm.allow_reroute,
            allow,
            pm.report,
            limits,
            pm.unsafe_any_host,
            hooks=tuple(r for r in routes if r is not None),
        )
        pools[pname] = pool
        if len(cover) == len(ps.egress):
            covering[pname] = dataclasses.replace(pool, egress=tuple(cover))
    return pools, covering


def _any_host(sh: Shape, pools: dict[str, Pool], marks: Marks) -> None:
    """'*' in a pool whose claims hold credentials is an error, unless the pool says
    ``unsafe_any_host``. Judged on what the claims declare, built or not."""
    for pname, pool in pools.items():
        holder = next(
            (c.model.id for c in sh.claims if c and c.model and c.model.pool == pname and c.credentials),
            None,
        )
        wide = pool.any_host_rule()
        if holder is not None and wide is not None:
            marks.add(
                rule_loc(wide.id) + ("host",),
                f"'*' allows any host, and claim {holder!r} of this pool holds credentials: list the "
                "hosts the pool may reach, or set 'unsafe_any_host: true' on the pool",
            )
