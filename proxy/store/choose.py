"""Which credential store a command uses: ``--store URL`` (PostgreSQL, for a fleet) or, by
default, the SQLite file in the state dir.

The key file is ``--key-file`` when given, else ``<state dir>/store.key`` (created 0600 when
absent). Nodes of a fleet must share it: :mod:`proxy.store.postgres` refuses to open with a key
file that lacks a key the database uses.

Errors: ValueError (a bad URL, no store where ``create=False`` needs one), StoreError, KeyFileError.
"""

from __future__ import annotations

from pathlib import Path

from proxy.store.base import CredentialStore
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import KEY_FILE, open_state_store


def open_store(
    state_dir: Path, url: str | None = None, key_file: Path | None = None, create: bool = True,
    wait: bool = True,
) -> CredentialStore:
    """The store ``url`` names (None: the state dir's SQLite file), under ``key_file``.
    ``wait=False`` (``surrogate run``): a PostgreSQL database that cannot be reached is no
    error (:meth:`proxy.store.postgres.PostgresStore.open`)."""
    if url is None:
        return open_state_store(state_dir, create=create, key_file=key_file)
    from proxy.store.postgres import PostgresStore, parse_url  # psycopg only for a fleet store

    parse_url(url)  # a bad URL (a password in it) is the first thing said, before any file is read
    key = key_file or state_dir / KEY_FILE
    if not create and not key.is_file():
        raise ValueError(f"{key}: no key file there (the store's values need it)")
    return PostgresStore.open(url, KeyRing.load_or_create(key), wait=wait)
