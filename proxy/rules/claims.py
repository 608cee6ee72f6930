"""A claim's parts, built from their models: credentials (placeholder, hosts, injection, budget,
surfaces and slots, value source), source addresses and the interface binding.

As in :mod:`proxy.rules.pools`, every problem is recorded at its field and the builder returns
None rather than stopping. A credential host must be safe to hold a secret
(:func:`proxy.rules.risks.credential_host_risk`) and covered by an intercepting egress rule of
the claim's pool that no opaque rule shadows. A secret value never appears in a message.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from proxy.core import placeholders, slots, templates
from proxy.core.errors import HostError, SecretUnavailable
from proxy.core.hosts import HostPattern
from proxy.core.policy import (
    INTERFACE_NAME,
    SURFACES,
    Credential,
    Injection,
    Misplaced,
    Network,
    Pool,
    Surface,
)
from proxy.core.sigv4 import Allowed, SigV4Spec
from proxy.core.slots import BasicPart
from proxy.rules import kinds
from proxy.rules.marks import Loc, Marks
from proxy.rules.models import TOKEN, ClaimModel, CredentialModel
from proxy.rules.risks import credential_host_risk, opaque_shadow
from proxy.rules.sources import ValueSource


def bind_interface(cm: ClaimModel, loc: Loc, marks: Marks) -> str | None:
    """A claim's ``interface``: its transparent connections must arrive there (issue 21). The
    name to bind, or None (none given, or a problem, said)."""
    if cm.interface is None:
        return None
    if not INTERFACE_NAME.match(cm.interface):
        marks.add(loc + ("interface",), f"{cm.interface!r} is not an interface name")
        return None
    if not cm.sources:
        marks.add(loc + ("interface",), "interface needs sources: it binds the claim's source addresses")
    return cm.interface


def networks(
    raw: list[str], loc: Loc, marks: Marks, owners: dict[Network, str], claim_id: str
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


def value_source(spec: str, base_dir: Path, loc: Loc, marks: Marks, read: bool = True) -> ValueSource | None:
    """The ``env:``/``file:`` source ``spec``; with ``read``, also read now (a source that cannot
    be read is a problem that names it, never its value). Without it, only its form is checked."""
    try:
        source = ValueSource.parse(spec, base_dir)
    except ValueError as e:
        marks.add(loc, str(e))
        return None
    if not read:
        return source
    try:
        source.current()
    except SecretUnavailable as e:
        marks.add(loc, str(e))
        return None
    return source


def _template_problem(km: CredentialModel) -> str | None:
    """Why ``km.placeholder`` does not fit its ``placeholder_template``, or None. A rules file
    holds its placeholder written out (stable across reloads: the sandbox is configured with it);
    ``surrogate placeholder mint TEMPLATE`` prints one, and the message shows a fresh one."""
    assert km.placeholder_template is not None  # noqa: S101 - the caller's guard
    try:
        template = templates.get(km.placeholder_template)
    except KeyError as e:
        return str(e.args[0])
    if placeholders.template_of(km.placeholder) is not template:
        return (
            f"placeholder is not of template {template.name!r} ({template.describe()}), "
            f"e.g. {templates.mint(template)}"
        )
    return None


def build_credential(
    km: CredentialModel,
    loc: Loc,
    pool: Pool | None,
    base_dir: Path,
    marks: Marks,
    seen: dict[str, str],
    claim_id: str,
    read: bool = True,
) -> Credential | None:
    before = len(marks.problems)
    if not placeholders.is_placeholder(km.placeholder):
        marks.add(
            loc + ("placeholder",),
            f"placeholder {km.placeholder!r} does not have the recognisable format "
            f"{placeholders.FORMATS} (e.g. {placeholders.generate()})",
        )
    elif km.placeholder_template is not None and (problem := _template_problem(km)):
        marks.add(loc + ("placeholder",), problem)
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
        if not TOKEN.match(header) or header.lower() == "host" or header.lower().startswith("proxy-"):
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
    spec = sigv4_spec(km, loc, marks)
    if spec is not None:
        surfaces = frozenset()  # signed, never swapped as a string (proxy.core.sigv4)
    source = value_source(km.value, base_dir, loc + ("value",), marks, read)
    minted = kinds.minting(
        km, hosts, source, lambda spec, at: value_source(spec, base_dir, at, marks, read), loc, marks, read
    )
    signs = kinds.signing(km, loc, marks)
    if source is None or len(marks.problems) != before:
        return None
    if minted is not None:  # the value injected is the minted token; the value minted with stays apart
        inject = inject or kinds.DEFAULT_INJECT
    return Credential(
        km.name,
        km.placeholder,
        tuple(hosts),
        minted.slot if minted is not None else source,
        inject,
        surfaces=surfaces,
        on_misplaced=Misplaced(km.on_misplaced),
        max_requests=km.max_requests,
        headers=headers,
        basic_parts=parts,
        kind=km.kind,
        mint=minted,
        sign=signs,
        sigv4=spec,
    )


def sigv4_spec(km: CredentialModel, loc: Loc, marks: Marks) -> SigV4Spec | None:
    """The ``aws_sigv4`` block of a credential of that kind (a problem marked otherwise)."""
    aws = km.aws_sigv4
    if km.kind != "aws_sigv4":
        if aws is not None:
            marks.add(loc + ("aws_sigv4",), "aws_sigv4 is only for a credential of kind aws_sigv4")
        return None
    if aws is None:
        marks.add(loc + ("aws_sigv4",), "a credential of kind aws_sigv4 needs an aws_sigv4 block")
        return None
    if km.inject is not None:
        marks.add(loc + ("inject",), "a credential of kind aws_sigv4 is signed, not injected")
    own = (
        ("secret_placeholder", aws.secret_placeholder),
        ("session_token_placeholder", aws.session_token_placeholder),
    )
    for key, p in own:
        if p is not None and (not placeholders.is_placeholder(p) or p == km.placeholder):
            example = placeholders.generate()
            marks.add(loc + ("aws_sigv4", key), f"{key} must be a placeholder of its own (e.g. {example})")
    allowed = Allowed(frozenset(aws.regions), frozenset(aws.services))
    return SigV4Spec(aws.secret_placeholder, aws.session_token_placeholder, allowed)


def _slots(
    km: CredentialModel, surfaces: frozenset[Surface], loc: Loc, marks: Marks
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


def _surfaces(km: CredentialModel, loc: Loc, marks: Marks) -> frozenset[Surface]:
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
