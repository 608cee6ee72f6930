"""Credential kinds in the store (issue 15, proxy/store/kinds.py, kindbuild.py), on every backend
(the conformance fixtures: SQLite and PostgreSQL): the kind and its spec travel with the row (a
full read, an incremental one, another handle), the refresh token is sealed apart, survives
another handle and key rotation, goes with its credential, cannot be swapped with the value, and
a stored kind that no longer parses fails closed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import canary
import pytest

from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Policy
from proxy.store.base import CredentialStore
from proxy.store.keyring import DecryptError
from proxy.store.registry import Registry
from unit.store.test_conformance import Backend, backend, other, store

__all__ = ["backend", "other", "store"]  # the fixtures, used by name

REFRESH = canary.make("kindrefresh").encode()
ROTATED = canary.make("kindrotated").encode()
SPEC = '{"client_id":"c","token_url":"https://api.test/token","grant":"refresh_token"}'


def _put(store: CredentialStore, **kw: object) -> object:
    return store.put_credential(
        "c1",
        "o",
        value=b"client-secret",
        hosts=["api.test"],
        kind="oauth_client",
        spec=SPEC,
        **kw,  # type: ignore[arg-type]
    )


def _registry(store: CredentialStore) -> Registry:
    r = Registry(Policy("test", {}, {}), store)
    r.refresh()
    return r


def test_the_kind_travels_with_its_row(store: CredentialStore, other: Callable[[], CredentialStore]) -> None:
    reader = _registry(other())  # a node that read before the write (PostgreSQL: incrementally after)
    _put(store, refresh_token=REFRESH)
    got = store.get_credential("c1", "o")
    assert got is not None and (got.kind, got.spec) == ("oauth_client", SPEC)
    assert store.list_credentials("c1")[0].kind == "oauth_client"
    assert store.snapshot()[1][0].spec == SPEC
    reader.refresh()
    c = reader.claim("c1")
    assert c is not None and c.credentials[0].kind == "oauth_client" and c.credentials[0].mint is not None
    patched = store.patch_credential("c1", "o", hosts=["api.test", "x.test"])
    assert (patched.kind, patched.spec) == ("oauth_client", SPEC)
    plain = store.put_credential("c1", "o", value=b"v", hosts=["api.test"])  # a PUT replaces the kind
    assert (plain.kind, plain.spec) == ("static", None)
    assert store.get_credential("c1", "o").kind == "static"  # type: ignore[union-attr]


def test_the_refresh_token_is_sealed_apart_kept_across_handles_and_key_rotation(
    backend: Backend, store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    _put(store, refresh_token=REFRESH)
    assert store.refresh_token("c1", "o") == REFRESH
    second = other()
    second.keep_refresh_token("c1", "o", ROTATED)  # another worker rotated it
    assert store.refresh_token("c1", "o") == ROTATED
    assert store.get_credential("c1", "o").version == 1  # type: ignore[union-attr]  # not a new version
    assert store.rotate_keys() >= 2
    assert store.refresh_token("c1", "o") == ROTATED
    at_rest = backend.at_rest()
    assert REFRESH not in at_rest and ROTATED not in at_rest
    assert store.delete_credential("c1", "o")
    _put(store)
    assert store.refresh_token("c1", "o") is None  # deleted with its credential


def test_keep_refresh_token_of_a_missing_credential_is_not_found(store: CredentialStore) -> None:
    from proxy.store.base import NotFound

    with pytest.raises(NotFound):
        store.keep_refresh_token("c1", "absent", ROTATED)


def test_a_refresh_token_ciphertext_does_not_decrypt_as_the_value(
    backend: Backend, store: CredentialStore
) -> None:
    if backend.kind != "sqlite":
        pytest.skip("direct row surgery on the SQLite file only")
    _put(store, refresh_token=REFRESH)
    db = sqlite3.connect(backend.state / "store.sqlite3")
    key_id, blob = db.execute("SELECT key_id, value FROM credential_tokens").fetchone()
    db.execute("UPDATE credentials SET key_id = ?, value = ?", (key_id, blob))
    db.commit()
    db.close()
    with pytest.raises(DecryptError):
        store.secret("c1", "o")


def test_a_stored_kind_that_no_longer_parses_fails_closed(backend: Backend, store: CredentialStore) -> None:
    if backend.kind != "sqlite":
        pytest.skip("direct row surgery on the SQLite file only")
    store.put_credential("c1", "a", value=b'{"access_key_id": "k", "secret_access_key": "s"}',
                         hosts=["s3.test"], kind="aws_sigv4", spec='{"regions": []}')  # fmt: skip
    c = _registry(store).claim("c1")
    assert c is not None
    built = c.credentials[0]
    assert built.kind == "aws_sigv4" and not built.surfaces and built.inject is None
    with pytest.raises(SecretUnavailable):
        built.secret()


def test_a_worker_scrubs_the_refresh_token_another_worker_rotated(
    store: CredentialStore, other: Callable[[], CredentialStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Response scrubbing reads a store credential's refresh token again after RECHECK seconds:
    a token another worker (or node) rotated in is caught here too, not only the first one."""
    from proxy.core.secrets import Secret
    from proxy.store import kindbuild

    _put(store, refresh_token=REFRESH)
    here = kindbuild.StoreRefresh(store, "c1", "o")
    there = kindbuild.StoreRefresh(other(), "c1", "o")
    assert here.current()[0].reveal() == REFRESH.decode()
    there.keep(Secret(ROTATED.decode()))
    assert here.current()[0].reveal() == REFRESH.decode()  # within RECHECK: from memory
    monkeypatch.setattr(kindbuild, "RECHECK", 0.0)
    assert here.current()[0].reveal() == ROTATED.decode()
