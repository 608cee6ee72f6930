"""What a stored row holds, for every backend: checked fields, the associated data that seals a
value to its place, the token hash, and rows ↔ records.

A value is encrypted with associated data ``claim_id NUL name NUL version`` (:func:`aad`), so a
ciphertext copied to another row or version fails to decrypt. A proxy token is stored as its
SHA-256 (:func:`token_hash`): the token is 256 random bits, so no slow hash is needed. JSON
columns (sources, hosts, surfaces, headers, basic_parts) hold JSON text in every backend, so one
row reader serves them all.

Errors: ValueError or TypeError naming the field, raised before anything is written.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from proxy.core import placeholders, slots
from proxy.core.policy import SURFACES, Misplaced
from proxy.store.base import ClaimRecord, CredentialRecord


def claim(row: Sequence[Any]) -> ClaimRecord:
    """A claims row (id, pool, sources, version, created_at, updated_at, interface) as a record."""
    return ClaimRecord(row[0], row[1], tuple(json.loads(row[2])), *row[3:])


def cred(row: Sequence[Any]) -> CredentialRecord:
    """A credentials row, in the order the backends select (``_CREDS``), as a record."""
    surfaces = None if row[11] is None else tuple(json.loads(row[11]))
    (
        claim_id,
        name,
        hosts,
        header,
        fmt,
        placeholder,
        version,
        created,
        updated,
        expires,
        used,
        _,
        misplaced,
        max_requests,
        requests_used,
        slot_headers,
        slot_parts,
        kind,
        spec,
    ) = row
    return CredentialRecord(
        claim_id, name, tuple(json.loads(hosts)), header, fmt, placeholder, version, created, updated,
        expires, used, surfaces, misplaced, max_requests, requests_used,
        None if slot_headers is None else tuple(json.loads(slot_headers)),
        None if slot_parts is None else tuple(json.loads(slot_parts)),
        kind or "static", spec,
    )  # fmt: skip


def credential_row(new: CredentialRecord, key_id: str, blob: bytes) -> dict[str, Any]:
    """The column values that store ``new`` with its sealed value ``blob`` under ``key_id``."""
    out = asdict(new)
    del out["kind"], out["spec"]  # in the side table credential_kinds
    return {
        **out,
        "hosts": json.dumps(new.hosts),
        "surfaces": None if new.surfaces is None else json.dumps(new.surfaces),
        "headers": None if new.headers is None else json.dumps(new.headers),
        "basic_parts": None if new.basic_parts is None else json.dumps(new.basic_parts),
        "key_id": key_id,
        "value": blob,
    }


def aad(claim_id: str, name: str, version: int) -> bytes:
    return f"{claim_id}\0{name}\0{version}".encode()


def token_aad(claim_id: str, name: str, generation: int) -> bytes:
    """The associated data of a credential's refresh token (credential_tokens): the value's own
    construction plus the slot it fills, so a ciphertext cannot move between a credential's value
    and its refresh token, nor between credentials or generations."""
    return f"{claim_id}\0{name}\0refresh_token\0{generation}".encode()


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()  # a 256-bit random token needs no slow hash


def check_ids(claim_id: str, name: str = "-") -> None:
    if not claim_id or not name or "\0" in claim_id + name:  # NUL separates the AAD's parts
        raise ValueError("claim ids and credential names must be non-empty and free of NUL")


def strings(what: str, items: Iterable[str]) -> tuple[str, ...]:
    if isinstance(items, str | bytes) or not all(isinstance(i, str) for i in items):
        raise TypeError(f"{what} must be a sequence of strings")
    return tuple(items)


def sources(items: Sequence[str]) -> list[str]:
    out: list[str] = []
    for s in strings("sources", items):
        try:
            net = ipaddress.ip_network(s, strict=False).compressed
        except ValueError:
            raise ValueError(f"source {s!r} is not an IP address or CIDR network") from None
        out += [] if net in out else [net]
    return out


def surfaces(items: Iterable[str]) -> tuple[str, ...]:
    names = strings("surfaces", items)
    if unknown := [n for n in names if n not in SURFACES]:
        raise ValueError(f"unknown surface {unknown[0]!r}; expected some of: {', '.join(SURFACES)}")
    order = [str(s) for s in SURFACES]
    return tuple(sorted(set(names), key=order.index))


def placeholder(text: str) -> str:
    if not isinstance(text, str) or not placeholders.is_placeholder(text):
        raise ValueError(
            f"placeholder {text!r} is not of the recognisable format: "
            f"{placeholders.PREFIX} then 16 to 64 ASCII letters or digits"
        )
    return text


def next_record(old: CredentialRecord, changes: dict[str, Any], now: float) -> CredentialRecord:
    """``old`` with ``changes`` (the value taken out) checked and normalised, at the next version.
    ``old`` may be a stand-in at version 0 for a new credential. Raises ValueError / TypeError."""
    if "hosts" in changes:
        changes["hosts"] = strings("hosts", changes["hosts"])
    if changes.get("surfaces") is not None:
        changes["surfaces"] = surfaces(changes["surfaces"])
    if changes.get("headers") is not None:
        changes["headers"] = tuple(sorted(slots.normalise_headers(strings("headers", changes["headers"]))))
    if changes.get("basic_parts") is not None:
        parts = slots.basic_parts(strings("basic_parts", changes["basic_parts"]))
        changes["basic_parts"] = tuple(str(p) for p in slots.BASIC_PARTS if p in parts)
    if changes.get("on_misplaced") is not None and changes["on_misplaced"] not in set(Misplaced):
        raise ValueError(f"on_misplaced {changes['on_misplaced']!r} is not one of: {', '.join(Misplaced)}")
    changes["placeholder"] = placeholder(changes.get("placeholder", old.placeholder))
    stamps = {"updated_at": now, "created_at": now if old.version == 0 else old.created_at}
    return CredentialRecord(**{**asdict(old), **changes, **stamps, "version": old.version + 1})
