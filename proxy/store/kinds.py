"""Credential kinds in the store (issue 15): ``static``, ``aws_sigv4``, ``oauth_client``, ``hmac``.

What is kept where::

    credentials.value       sealed (AES-256-GCM, rows.aad): every secret of the credential —
                            static / hmac: the value; oauth_client: the client secret or the PEM
                            private key; aws_sigv4: JSON {access_key_id, secret_access_key,
                            session_token?} (proxy.core.sigv4.real_keys)
    credential_kinds        kind + its spec, JSON with no secret (:func:`spec_json`): aws_sigv4
                            {regions, services, secret_placeholder, session_token_placeholder};
                            oauth_client the mint spec (token_url, client_id, grant, ...);
                            hmac the sign spec. Written with the credentials row in one
                            transaction; a static credential has no row here.
    credential_spec_placeholders  an aws_sigv4 spec's placeholders, one row each (primary key
                            (claim_id, placeholder)), written with the kind row: the uniqueness
                            check of a write is indexed lookups, not a read of the claim
    credential_tokens       an oauth_client's refresh token (grant refresh_token), sealed under
                            rows.token_aad(claim, name, generation); a PUT replaces it, a rotation
                            by the token endpoint (:meth:`KindQueries.keep_refresh_token`) seals
                            the new one at generation + 1, so a restart uses the newest.

Reading: the credentials selects end with the kind and spec (correlated sub-selects of
credential_kinds, spelled out in each statement, so every
backend and every reader — the PostgreSQL store's incremental ``changes_since`` included — gets
the kind with the row it belongs to). :func:`parts` turns a stored spec into the core's objects;
it raises ValueError naming the field, never a value (a spec is validated when written by
proxy.control.kinds).
"""

from __future__ import annotations

import json
import time
from abc import abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core import hmacsign, mint
from proxy.core.sigv4 import Allowed, SigV4Spec
from proxy.store import rows
from proxy.store.base import Conflict, NotFound

if TYPE_CHECKING:
    from proxy.store.base import Conn
    from proxy.store.keyring import KeyRing

KINDS = ("static", "aws_sigv4", "oauth_client", "hmac")
_TOKEN = "SELECT key_id, value, generation FROM credential_tokens WHERE claim_id = ? AND name = ?"  # noqa: S105
# who else in the claim holds a placeholder: as its ``placeholder`` (credentials.placeholder is
# UNIQUE: an index) or in its spec (credential_spec_placeholders' primary key); O(1) rows each
_HOLDERS = (
    "SELECT name FROM credentials WHERE claim_id = ? AND placeholder = ? AND name <> ?",
    "SELECT name FROM credential_spec_placeholders WHERE claim_id = ? AND placeholder = ? AND name <> ?",
)


def spec_json(spec: dict[str, Any]) -> str:
    """The canonical text of a spec (sorted keys: an unchanged spec compares equal)."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def spec_placeholders(kind: str | None, spec: str | None) -> set[str]:
    """The placeholders a kind's spec gives the sandbox beside ``placeholder``: an aws_sigv4
    credential's secret key and session token placeholders; none for the other kinds."""
    if kind != "aws_sigv4" or not spec:
        return set()
    doc = json.loads(spec)
    return {p for p in (doc.get("secret_placeholder"), doc.get("session_token_placeholder")) if p}


@dataclass(frozen=True, slots=True)
class Parts:
    """What a stored kind makes of a credential (the fields of proxy.core.policy.Credential)."""

    sigv4: SigV4Spec | None = None
    sign: hmacsign.SignSpec | None = None
    mint: mint.MintSpec | None = None


def _strings(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"{key} must be a list of strings")
    return tuple(items)


def parts(kind: str, doc: dict[str, Any]) -> Parts:
    """The core objects of ``kind`` from its spec ``doc``. ValueError naming the field."""
    if kind == "aws_sigv4":
        regions, services = _strings(doc, "regions"), _strings(doc, "services")
        if not regions or not services:
            raise ValueError("aws_sigv4 needs at least one region and one service")
        secret, token = doc.get("secret_placeholder"), doc.get("session_token_placeholder")
        if not isinstance(secret, str) or not (token is None or isinstance(token, str)):
            raise ValueError("aws_sigv4 placeholders must be strings")
        return Parts(sigv4=SigV4Spec(secret, token, Allowed(frozenset(regions), frozenset(services))))
    if kind == "hmac":
        d = hmacsign.SignSpec()
        sign = hmacsign.SignSpec(
            str(doc.get("algorithm", d.algorithm)),
            _strings(doc, "parts") if "parts" in doc else d.parts,
            str(doc.get("separator", d.separator)),
            str(doc.get("encoding", d.encoding)),
            str(doc.get("header", d.header)),
            str(doc.get("format", d.format)),
            str(doc.get("timestamp_header", d.timestamp_header)),
            int(doc.get("max_body", d.max_body)),
        )
        if found := hmacsign.problems(sign):
            raise ValueError(f"sign.{found[0][0]}: {found[0][1]}")
        return Parts(sign=sign)
    if kind == "oauth_client":
        if not isinstance(doc.get("token_url"), str) or not isinstance(doc.get("client_id"), str):
            raise ValueError("mint needs token_url and client_id (strings)")
        grant = str(doc.get("grant", "client_credentials"))
        auth = doc.get("client_auth")
        signs = grant == "jwt_bearer" or auth == "private_key_jwt"
        spec = mint.MintSpec(
            mint.TokenURL.parse(doc["token_url"]),
            doc["client_id"],
            grant,
            str(auth) if auth is not None else ("private_key_jwt" if signs else "secret_basic"),
            _strings(doc, "scopes") if "scopes" in doc else (),
            doc.get("audience"),
            doc.get("subject"),
            str(doc.get("algorithm", "RS256")),
            float(doc.get("margin", mint.DEFAULT_MARGIN)),
        )
        if found := mint.problems(spec):
            raise ValueError(f"mint.{found[0][0]}: {found[0][1]}")
        return Parts(mint=spec)
    raise ValueError(f"unknown kind {kind!r}; expected one of: {', '.join(KINDS)}")


class KindQueries:
    """The kind side tables' statements, shared by the backends (a mixin of SQLStore)."""

    _keyring: KeyRing

    @abstractmethod
    def _write(self) -> AbstractContextManager[Conn]: ...

    @abstractmethod
    def _auto(self) -> AbstractContextManager[Conn]: ...

    def _holder(self, db: Conn, claim_id: str, name: str, mine: set[str]) -> tuple[str, str] | None:
        """(placeholder, credential) for the first of ``mine`` (in sorted order) that another
        credential of the claim holds, as its ``placeholder`` or in its spec; None when none is."""
        for placeholder in sorted(mine):
            for sql in _HOLDERS:
                if row := db.execute(sql, (claim_id, placeholder, name)).fetchone():
                    return placeholder, row[0]
        return None

    def placeholder_holder(self, claim_id: str, name: str, mine: set[str]) -> tuple[str, str] | None:
        """The control API's early answer (outside the write, so only a hint; the write checks
        again inside its transaction): :meth:`_holder`, two index lookups per placeholder."""
        with self._auto() as db:
            return self._holder(db, claim_id, name, mine)

    def _check_placeholders(
        self, db: Conn, claim_id: str, name: str, placeholder: str, kind: str, spec: str | None
    ) -> None:
        """Inside the credential's write transaction: none of its placeholders (an aws_sigv4
        spec's too) is one of another credential of the claim; Conflict naming the holder.
        The write transaction serialises writers on both backends (SQLite ``BEGIN IMMEDIATE``,
        PostgreSQL's ``data_version`` row lock), so two concurrent PUTs cannot both pass: the
        control API's check before the write only answers early. Indexed lookups, not a read of
        the claim: ``credentials.placeholder`` is UNIQUE, a spec's placeholders have their rows
        in ``credential_spec_placeholders`` (primary key (claim_id, placeholder), a second
        backstop against a doubled spec placeholder), written by :meth:`_save_kind`."""
        if found := self._holder(db, claim_id, name, {placeholder} | spec_placeholders(kind, spec)):
            raise Conflict(f"placeholder {found[0]} is already used by credential {found[1]!r}")

    def _save_kind(self, db: Conn, claim_id: str, name: str, kind: str, spec: str | None) -> None:
        """Inside the credential's write transaction: its kind row (none for ``static``)."""
        db.execute("DELETE FROM credential_kinds WHERE claim_id = ? AND name = ?", (claim_id, name))
        key = (claim_id, name)
        db.execute("DELETE FROM credential_spec_placeholders WHERE claim_id = ? AND name = ?", key)
        if kind != "static":
            if kind not in KINDS or spec is None:
                raise ValueError(f"kind {kind!r} needs its spec (one of: {', '.join(KINDS)})")
            db.execute("INSERT INTO credential_kinds VALUES (?, ?, ?, ?)", (claim_id, name, kind, spec))
            for placeholder in sorted(spec_placeholders(kind, spec)):
                db.execute(
                    "INSERT INTO credential_spec_placeholders VALUES (?, ?, ?)", (claim_id, name, placeholder)
                )

    def _seal_refresh(self, db: Conn, claim_id: str, name: str, token: bytes | None) -> None:
        """Inside a write transaction: replace the refresh token (None: remove it)."""
        row = db.execute(_TOKEN, (claim_id, name)).fetchone()
        generation = (row[2] if row else 0) + 1
        db.execute("DELETE FROM credential_tokens WHERE claim_id = ? AND name = ?", (claim_id, name))
        if token is None:
            return
        if not isinstance(token, bytes) or not token:
            raise TypeError("refresh_token must be non-empty bytes")
        key_id, blob = self._keyring.encrypt(token, rows.token_aad(claim_id, name, generation))
        db.execute(
            "INSERT INTO credential_tokens VALUES (?, ?, ?, ?, ?, ?)",
            (claim_id, name, generation, time.time(), key_id, blob),
        )

    def refresh_token(self, claim_id: str, name: str) -> bytes | None:
        """The newest refresh token of the credential (decrypted), None when it has none."""
        with self._auto() as db:
            row = db.execute(_TOKEN, (claim_id, name)).fetchone()
        if row is None:
            return None
        key_id, blob, generation = row
        return self._keyring.decrypt(key_id, blob, rows.token_aad(claim_id, name, generation))

    def keep_refresh_token(self, claim_id: str, name: str, token: bytes) -> None:
        """Seal a rotated refresh token (generation + 1). NotFound when the credential is gone.
        It does not change the credential's row or version: no node rebuilds the credential
        (its minted access token is kept), the next mint reads this one."""
        with self._write() as db:
            if not db.execute(
                "SELECT 1 FROM credentials WHERE claim_id = ? AND name = ?", (claim_id, name)
            ).fetchone():
                raise NotFound(f"credential {name!r} of claim {claim_id!r} not found")
            self._seal_refresh(db, claim_id, name, token)

    def _rotate_tokens(self, db: Conn, batch_size: int) -> list[Sequence[Any]]:
        """One batch of key rotation over the refresh tokens (inside its write transaction)."""
        sql = (
            "SELECT claim_id, name, key_id, value, generation FROM credential_tokens "
            "WHERE key_id != ? LIMIT ?"
        )
        batch = db.execute(sql, (self._keyring.current, batch_size)).fetchall()
        for claim_id, name, key_id, blob, generation in batch:
            aad = rows.token_aad(claim_id, name, generation)
            kid, sealed = self._keyring.encrypt(self._keyring.decrypt(key_id, blob, aad), aad)
            db.execute(
                "UPDATE credential_tokens SET key_id = ?, value = ? WHERE claim_id = ? AND name = ?",
                (kid, sealed, claim_id, name),
            )
        return list(batch)
