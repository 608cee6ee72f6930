"""The pieces a dry run is built from, shared by ``rules explain`` (:mod:`proxy.cli.explain`)
and ``audit why`` (:mod:`proxy.cli.why`): the claims in force (a rules file, plus a state dir's
store), a claim's credentials with stand-in sources that read nothing, the request's header
fields as the proxy's addons would see them, and where each credential would land.

A stand-in's value is ``<secret:NAME>``: the core swaps it like a secret, so the planned header
fields show which header each credential would land in, and no secret is ever read.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from proxy.core import placeholders
from proxy.core.decide import Decision, Reason, deny
from proxy.core.errors import HostError
from proxy.core.hosts import split_authority
from proxy.core.policy import Claim, Policy
from proxy.core.secrets import Secret
from proxy.rules.loader import load_rules
from proxy.store.registry import Registry
from proxy.store.sqlite import open_state_store

Claims = Policy | Registry


@dataclass(frozen=True, slots=True)
class Placement:
    """A credential the request would carry: ``how`` is swapped, swapped in Basic, or injected."""

    credential: str
    header: str
    how: str


@dataclass(frozen=True, slots=True)
class StandIn:
    """A value source that reads nothing: its value names the credential."""

    name: str

    def current(self) -> tuple[Secret, int]:
        return Secret(marker(self.name)), 0


def marker(name: str) -> str:
    return f"<secret:{name}>"


def stand_in(claim: Claim) -> Claim:
    """``claim`` with every credential's source replaced by a stand-in (same index shape)."""
    creds = tuple(dataclasses.replace(c, source=StandIn(c.name)) for c in claim.credentials)
    return Claim.build(claim.id, claim.pool, claim.proxy_token, creds, claim.origin, claim.sources)


def lookup(claims: Claims, claim_id: str) -> tuple[Claim, Policy]:
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


def authority_refusal(headers: Sequence[tuple[str, str]], host: str, port: int) -> Decision | None:
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


def basic(value: bytes) -> bytes | None:
    parts = value.split(None, 1)
    if len(parts) != 2 or parts[0].lower() != b"basic":
        return None
    try:
        return base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None


def placements(fields: Sequence[tuple[bytes, bytes]], used: Sequence[str], claim: Claim) -> list[Placement]:
    """Where each used credential's stand-in value landed in the planned header fields."""
    creds = {c.name: c for c in claim.credentials}
    out: list[Placement] = []
    for raw_name, value in fields:
        header = raw_name.decode("latin-1")
        decoded = basic(value) if header.lower() == "authorization" else None
        for name in used:
            mark, inject = marker(name).encode(), creds[name].inject
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


def unregistered(fields: Sequence[tuple[bytes, bytes]], target: bytes, claim: Claim) -> list[str]:
    notes = []
    for where, value in [*((f"header {n.decode('latin-1')}", v) for n, v in fields), ("the URL", target)]:
        for m in placeholders.find(value):
            if m.group() not in claim.by_placeholder:
                text = m.group().decode()
                notes.append(
                    f"{text} in {where} is not a placeholder of claim {claim.id!r}: it passes as text"
                )
    return notes


def request_fields(
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


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@contextlib.contextmanager
def loaded_claims(rules: Path, state_dir: Path | None, read_sources: bool = False) -> Iterator[Claims]:
    """The rules file's claims, plus the store's when ``state_dir`` is given (never created).
    The rules file's value sources are read only with ``read_sources`` (a dry run needs none)."""
    policy = load_rules(rules, read_secrets=read_sources)
    if state_dir is None:
        yield policy
        return
    with open_state_store(state_dir, create=False) as store:  # a dry run never creates a store
        registry = Registry(policy, store)
        registry.refresh()
        yield registry
