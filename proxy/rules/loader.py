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

The fields are documented in ``rules/README.md``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.core import hooks, placeholders, slots
from proxy.core.errors import HostError, Problem, RulesError, SecretUnavailable
from proxy.core.hosts import HostPattern
from proxy.core.limits import DEFAULT_BURST, DEFAULT_CONNECTIONS, DEFAULT_HOOK_PROCESSES, DEFAULT_RATE, Limits
from proxy.core.limits import DEFAULT_WEBSOCKET_MESSAGE as DEFAULT_WS_MESSAGE
from proxy.core.limits import MAX_WEBSOCKET_MESSAGE as MAX_WS_MESSAGE
from proxy.core.limits import MIN_WEBSOCKET_MESSAGE as MIN_WS_MESSAGE
from proxy.core.paths import prefix_problem
from proxy.core.policy import (
    DEFAULT_SURFACES,
    INTERFACE_NAME,
    SURFACES,
    Claim,
    Credential,
    EgressRule,
    Injection,
    Misplaced,
    Network,
    Policy,
    Pool,
    SourceToken,
    Surface,
)
from proxy.core.slots import BasicPart
from proxy.core.suffixes import confusable, internal, wildcard_risk
from proxy.rules.sources import ValueSource

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 §5.6.2 token
_SECRET_FIELDS = ("value", "proxy_token")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class RuleModel(_Model):
    host: str
    ports: list[int] = Field(default_factory=lambda: [443])
    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=lambda: ["/"])
    intercept: bool = True
    report: bool = False
    scheme: Literal["https", "http"] = "https"


class HookModel(_Model):
    host: str
    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=lambda: ["/"])
    command: list[str]
    timeout: float = hooks.DEFAULT_TIMEOUT


class LimitsModel(_Model):
    connections: int = DEFAULT_CONNECTIONS
    requests_per_second: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST
    hook_processes: int = DEFAULT_HOOK_PROCESSES
    websocket_message_bytes: int = DEFAULT_WS_MESSAGE


class PoolModel(_Model):
    egress: list[RuleModel] = Field(default_factory=list)
    hooks: list[HookModel] = Field(default_factory=list)
    allow_reroute: bool = False
    allow_cidrs: list[str] = Field(default_factory=list)
    report: bool = False
    limits: LimitsModel = Field(default_factory=LimitsModel)
    unsafe_any_host: bool = False  # allow a '*' egress rule although the pool's claims hold credentials


class InjectModel(_Model):
    set_header: str
    format: str = "Bearer {value}"


class CredentialModel(_Model):
    name: str
    value: str
    placeholder: str
    hosts: list[str] = Field(min_length=1)
    inject: InjectModel | None = None
    max_requests: int | None = None
    surfaces: list[str] = Field(default_factory=lambda: [str(x) for x in DEFAULT_SURFACES])
    headers: list[str] | None = None  # header slots (proxy.core.slots); None: DEFAULT_HEADERS
    basic_parts: list[str] | None = None  # Basic slots (proxy.core.slots); None: the password
    on_misplaced: str = Misplaced.CARRY.value


class ClaimModel(_Model):
    id: str
    pool: str
    proxy_token: str
    sources: list[str] = Field(default_factory=list)
    interface: str | None = None  # transparent mode: the interface (veth, bridge port) it arrives on
    credentials: list[CredentialModel] = Field(default_factory=list)


class RulesModel(_Model):
    version: Literal[1]
    pools: dict[str, PoolModel]
    claims: list[ClaimModel] = Field(default_factory=list)


Loc = tuple[str | int, ...]


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Marks:
    """Line/column of every node in the YAML document, keyed by its path."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.at: dict[Loc, tuple[int, int]] = {}
        self.problems: list[Problem] = []
        self.alias_seen = False

    def walk(
        self, node: yaml.Node, loc: Loc = (), visited: set[int] | None = None, key: yaml.Node | None = None
    ) -> None:
        """Record every node's position; refuse duplicate keys and YAML aliases.

        An alias makes the composer hand back the anchored node a second time, so a node seen
        twice is an alias: refused, which also stops recursive anchors and "billion laughs"
        files before anything is constructed.
        """
        visited = set() if visited is None else visited
        if id(node) in visited:
            if not self.alias_seen:  # said once: a "billion laughs" file would repeat it endlessly
                self.alias_seen = True
                message = "YAML anchors and aliases (&name, *name, <<: *name) are not supported; write it out"
                self.add(loc, message, key)
            return
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            visited.add(id(node))
        self.at[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value in node.value:
                k = str(key_node.value)
                if k in seen:
                    self.add(loc + (k,), f"duplicate key {k!r}", key_node)
                seen.add(k)
                self.walk(value, loc + (k,), visited, key_node)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.walk(item, loc + (i,), visited)

    def sorted(self) -> list[Problem]:
        """Problems in file order (checks run in field order, which need not be file order)."""
        return sorted(self.problems, key=lambda p: (p.line or 0, p.column or 0))

    def add(self, loc: Loc, message: str, node: yaml.Node | None = None) -> None:
        line: int | None
        col: int | None
        if node is not None:
            line, col = node.start_mark.line + 1, node.start_mark.column + 1
        else:
            probe = loc
            while probe not in self.at and probe:
                probe = probe[:-1]
            line, col = self.at.get(probe, (None, None))
        self.problems.append(Problem(self.file, line, col, _dotted(loc), message))


def _model_at(loc: Loc) -> Any:
    """The pydantic model class found at ``loc`` (to list the fields an unknown key could be)."""
    cur: Any = RulesModel
    for part in loc:
        while type(cur).__name__ == "UnionType":  # X | None
            cur = next(a for a in get_args(cur) if a is not type(None))
        origin, args = get_origin(cur), get_args(cur)
        if origin is list:
            cur = args[0]
        elif origin is dict:
            cur = args[1]  # `part` is a key chosen by the author, e.g. a pool name
        elif isinstance(cur, type) and issubclass(cur, BaseModel) and part in cur.model_fields:
            cur = cur.model_fields[str(part)].annotation
        else:
            return cur
    while type(cur).__name__ == "UnionType":
        cur = next(a for a in get_args(cur) if a is not type(None))
    return cur


def _pydantic_problems(err: ValidationError, marks: _Marks) -> None:
    for e in err.errors():
        loc: Loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            is_model = isinstance(model, type) and issubclass(model, BaseModel)
            known = ", ".join(model.model_fields) if is_model else ""
            marks.add(loc, f"unknown field {loc[-1]!r}; expected one of: {known}")
        elif e["type"] == "missing":
            marks.add(loc, "required field is missing")
        elif loc and loc[-1] in _SECRET_FIELDS:
            marks.add(loc, "must be a string 'env:NAME' or 'file:PATH'")
        else:
            marks.add(loc, e["msg"])


def load_rules(path: str | Path) -> Policy:
    """Load and fully validate the rules file at ``path``.

    Raises RulesError listing every problem (file, line, column, field, message).
    """
    path = Path(path)
    file = str(path)
    marks = _Marks(file)
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
        _pydantic_problems(e, marks)
        raise RulesError(marks.sorted()) from None
    policy = _build(model, path.parent.resolve(), marks)
    if marks.problems:
        raise RulesError(marks.sorted())
    return policy


def _build(model: RulesModel, base_dir: Path, marks: _Marks) -> Policy:
    pools: dict[str, Pool] = {}
    broken: set[str] = set()  # pools with a rule in error: coverage checks would mislead
    for pname, pm in model.pools.items():
        rules: list[EgressRule] = []
        for i, rm in enumerate(pm.egress):
            rule = _rule(pname, i, rm, ("pools", pname, "egress", i), marks)
            if rule is not None:
                rules.append(rule)
            else:
                broken.add(pname)
        allow = _networks(pm.allow_cidrs, ("pools", pname, "allow_cidrs"), marks, {}, pname)
        limits = _limits(pm.limits, ("pools", pname, "limits"), marks)
        pools[pname] = Pool(
            pname, tuple(rules), pm.allow_reroute, allow, pm.report, limits, pm.unsafe_any_host
        )
        routes = [
            _hook(pname, i, hm, ("pools", pname, "hooks", i), base_dir, marks)
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
        token = _source(cm.proxy_token, base_dir, loc + ("proxy_token",), marks)
        creds: list[Credential] = []
        names: set[str] = set()
        for ki, km in enumerate(cm.credentials):
            kloc = loc + ("credentials", ki)
            if km.name in names:
                marks.add(kloc + ("name",), f"duplicate credential name {km.name!r} in claim {cm.id!r}")
            names.add(km.name)
            covering = None if cm.pool in broken else pool
            cred = _credential(km, kloc, covering, base_dir, marks, seen_placeholders, cm.id)
            if cred is not None:
                creds.append(cred)
        if token is not None:
            sources = _networks(cm.sources, loc + ("sources",), marks, owners, cm.id)
            claim = Claim.build(cm.id, cm.pool, SourceToken(token), tuple(creds), "rules", sources)
            claims[cm.id] = _bind_interface(claim, cm, loc, marks)
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
    warnings = _warnings(model, pools, claims, marks)
    return Policy(marks.file, pools, claims, tuple(warnings))


def _rule(pool: str, i: int, rm: RuleModel, loc: Loc, marks: _Marks) -> EgressRule | None:
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
        if not _TOKEN.match(method) or method != method.upper():
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
    if not ok:
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
    )


def _hook(
    pool: str, i: int, hm: HookModel, loc: Loc, base_dir: Path, marks: _Marks
) -> hooks.HookRoute | None:
    """A hook route; its command's program must exist and be executable (a relative path is taken
    from the rules file's folder)."""
    n = len(marks.problems)
    try:
        host = HostPattern.parse(hm.host)
    except HostError as e:
        marks.add(loc + ("host",), str(e))
    for j, method in enumerate(hm.methods):
        if not _TOKEN.match(method) or method != method.upper():
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


def _limits(lm: LimitsModel, loc: Loc, marks: _Marks) -> Limits:
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
    return Limits(lm.connections, lm.requests_per_second, lm.burst, lm.hook_processes, websocket_message=ws)




def _bind_interface(claim: Claim, cm: ClaimModel, loc: Loc, marks: _Marks) -> Claim:
    """A claim's ``interface``: its transparent connections must arrive there (issue 21)."""
    if cm.interface is None:
        return claim
    if not INTERFACE_NAME.match(cm.interface):
        marks.add(loc + ("interface",), f"{cm.interface!r} is not an interface name")
        return claim
    if not cm.sources:
        marks.add(loc + ("interface",), "interface needs sources: it binds the claim's source addresses")
    return dataclasses.replace(claim, interface=cm.interface)


def _networks(
    raw: list[str], loc: Loc, marks: _Marks, owners: dict[Network, str], claim_id: str
) -> tuple[Network, ...]:
    """Parse a claim's source addresses/CIDRs; the same network may not name two claims."""
    out = []
    for j, text in enumerate(raw):
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            marks.add(loc + (j,), f"{text!r} is not an IP address or CIDR (e.g. 10.0.0.5 or 10.0.0.0/24)")
            continue
        if net in owners and owners[net] != claim_id:
            marks.add(loc + (j,), f"source {net} already identifies claim {owners[net]!r}")
            continue
        owners[net] = claim_id
        out.append(net)
    return tuple(out)


def _warnings(
    model: RulesModel, pools: dict[str, Pool], claims: dict[str, Claim], marks: _Marks
) -> list[Problem]:
    """Risky but valid: '*' in a pool whose claims hold credentials, wildcards over shared-hosting
    suffixes, rules an earlier rule overlaps so that order decides (for CONNECT, the first
    host-and-port match picks interception or an opaque tunnel), port 80 under scheme https
    (likely meant as plain HTTP), and header slots that hosts commonly reflect
    (proxy.core.slots.REFLECTED)."""
    before = len(marks.problems)
    credentialed = {c.pool for c in claims.values() if c.credentials}
    for name, pool in pools.items():
        for i, rule in enumerate(pool.egress):
            loc: Loc = ("pools", name, "egress", i, "host")
            if rule.host.any_host and name in credentialed and pool.unsafe_any_host:
                message = "'*' allows any host in a pool whose claims hold credentials (unsafe_any_host)"
                marks.add(loc, message)
            if rule.scheme == "https" and 80 in rule.ports:
                marks.add(
                    ("pools", name, "egress", i, "ports"),
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
    for ci, cm in enumerate(model.claims):  # addresses and internal names as credential hosts
        for ki, km in enumerate(cm.credentials):
            for j, raw in enumerate(km.hosts):
                try:
                    pattern = HostPattern.parse(raw)
                except HostError:
                    continue
                name = (pattern.suffix or "").lstrip(".") or pattern.text
                if not pattern.any_host and (why := internal(name)) is not None:
                    where: Loc = ("claims", ci, "credentials", ki, "hosts", j)
                    marks.add(where, f"credential host {pattern}: {why}")
    for ci, km_claim in enumerate(model.claims):
        for k, km in enumerate(km_claim.credentials):
            for j, header in enumerate(km.headers or ()):
                if header.lower() in slots.REFLECTED:
                    where = ("claims", ci, "credentials", k, "headers", j)
                    marks.add(
                        where,
                        f"{header} is a header hosts commonly reflect: a secret swapped there may come back",
                    )
    found = marks.problems[before:]
    del marks.problems[before:]
    return [dataclasses.replace(p, severity="warning") for p in found]


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


def _source(spec: str, base_dir: Path, loc: Loc, marks: _Marks) -> ValueSource | None:
    try:
        source = ValueSource.parse(spec, base_dir)
    except ValueError as e:
        marks.add(loc, str(e))
        return None
    try:
        source.current()
    except SecretUnavailable as e:
        marks.add(loc, str(e))
        return None
    return source


def _credential(
    km: CredentialModel,
    loc: Loc,
    pool: Pool | None,
    base_dir: Path,
    marks: _Marks,
    seen: dict[str, str],
    claim_id: str,
) -> Credential | None:
    before = len(marks.problems)
    if not placeholders.is_placeholder(km.placeholder):
        marks.add(
            loc + ("placeholder",),
            f"placeholder {km.placeholder!r} does not have the recognisable format "
            f"'{placeholders.PREFIX}' + 16..64 letters or digits (e.g. {placeholders.generate()})",
        )
    elif km.placeholder in seen:
        marks.add(loc + ("placeholder",), f"placeholder already used by {seen[km.placeholder]}")
    else:
        seen[km.placeholder] = f"claim {claim_id!r} credential {km.name!r}"
    hosts: list[HostPattern] = []
    for j, raw in enumerate(km.hosts):
        try:
            pattern = HostPattern.parse(raw)
        except HostError as e:
            marks.add(loc + ("hosts", j), str(e))
            continue
        hosts.append(pattern)
        if (why := credential_host_risk(pattern)) is not None:
            marks.add(loc + ("hosts", j), f"credential host {pattern}: {why}; list the exact hosts instead")
        elif pool is not None and not any(
            r.intercept and r.scheme == "https" and r.host.covers(pattern) for r in pool.egress
        ):
            marks.add(
                loc + ("hosts", j),
                f"host {pattern} is not covered by an intercepting egress rule of pool "
                f"{pool.name!r}; add one (intercept: true) or remove the host",
            )
        elif pool is not None and (shadow := opaque_shadow(pool, pattern)) is not None:
            marks.add(
                loc + ("hosts", j),
                f"host {pattern} would be tunnelled opaque by the earlier rule {shadow.label()} "
                "(intercept: false), so the credential could never apply; move the intercepting "
                "rule above it",
            )
    inject = None
    if km.inject is not None:
        header = km.inject.set_header
        if not _TOKEN.match(header) or header.lower() == "host" or header.lower().startswith("proxy-"):
            marks.add(loc + ("inject", "set_header"), f"{header!r} is not a header surrogate may set")
        if any(ord(c) < 32 or ord(c) == 127 for c in km.inject.format):
            marks.add(loc + ("inject", "format"), "format must not contain control characters")
        elif "{value}" not in km.inject.format:
            marks.add(loc + ("inject", "format"), "format must contain '{value}', e.g. 'Bearer {value}'")
        inject = Injection(header, km.inject.format)
    if km.max_requests is not None and km.max_requests < 1:
        marks.add(
            loc + ("max_requests",),
            f"max_requests {km.max_requests} must be at least 1 (omit it for no budget)",
        )
    surfaces = _surfaces(km, loc, marks)
    headers, parts = _slots(km, surfaces, loc, marks)
    source = _source(km.value, base_dir, loc + ("value",), marks)
    if source is None or len(marks.problems) != before:
        return None
    return Credential(
        km.name,
        km.placeholder,
        tuple(hosts),
        source,
        inject,
        surfaces=surfaces,
        on_misplaced=Misplaced(km.on_misplaced),
        max_requests=km.max_requests,
        headers=headers,
        basic_parts=parts,
    )


def _slots(
    km: CredentialModel, surfaces: frozenset[Surface], loc: Loc, marks: _Marks
) -> tuple[frozenset[str], frozenset[BasicPart]]:
    """The header and Basic slots (proxy.core.slots); a bad name, or slots for a surface the
    credential does not enable, is a problem."""
    headers = slots.DEFAULT_HEADERS
    if km.headers is not None:
        if Surface.HEADER not in surfaces:
            marks.add(
                loc + ("headers",), "headers names where the header surface swaps; add 'header' to surfaces"
            )
        for j, name in enumerate(km.headers):
            if (why := slots.header_problem(name)) is not None:
                marks.add(loc + ("headers", j), why)
        headers = frozenset(h.lower() for h in km.headers)
    parts = slots.DEFAULT_BASIC_PARTS
    if km.basic_parts is not None:
        if not {Surface.BASIC, Surface.USERINFO} & surfaces:
            marks.add(
                loc + ("basic_parts",),
                "basic_parts names where the basic surface swaps; add 'basic' to surfaces",
            )
        for j, name in enumerate(km.basic_parts):
            if name not in set(BasicPart):
                marks.add(
                    loc + ("basic_parts", j), f"unknown Basic part {name!r}; expected some of: user, password"
                )
        parts = frozenset(BasicPart(n) for n in km.basic_parts if n in set(BasicPart))
    return headers, parts


def _surfaces(km: CredentialModel, loc: Loc, marks: _Marks) -> frozenset[Surface]:
    """The surfaces a credential enables; unknown names and a bad ``on_misplaced`` are problems."""
    known = ", ".join(SURFACES)
    out: set[Surface] = set()
    for j, name in enumerate(km.surfaces):
        if name not in SURFACES:
            marks.add(loc + ("surfaces", j), f"unknown surface {name!r}; expected one of: {known}")
        else:
            out.add(Surface(name))
    if km.on_misplaced not in set(Misplaced):
        choices = ", ".join(Misplaced)
        marks.add(loc + ("on_misplaced",), f"unknown action {km.on_misplaced!r}; expected one of: {choices}")
    return frozenset(out)
