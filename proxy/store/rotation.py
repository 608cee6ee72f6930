"""Key rotation, for every backend: re-encrypt each stored value under a new current key, in
batches, resumable, then retire the keys no value uses any more.

Each batch is one write transaction of the backend (writers are serialised and re-read the key
file inside theirs), so a writer waits at most one batch, and a key is retired only inside a
write transaction after no row uses it: no process can seal a value under a key that is being
retired. A rotation stopped anywhere (``kill -9``, ``max_batches``) leaves every value readable
under a key still in the file; ``rotate_keys(new_key=False)`` finishes it. The associated data of
a value does not change, so a re-encrypted value stays bound to its claim, name and version.

Errors: StoreError (the store cannot be written), DecryptError (a value does not decrypt: the
rotation stops there, nothing of that batch is written), KeyFileError (the key file).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from proxy.store.rows import aad

if TYPE_CHECKING:
    from proxy.store.base import Conn
    from proxy.store.keyring import KeyRing


class KeyRotation:
    _keyring: KeyRing

    @abstractmethod
    def _write(self) -> AbstractContextManager[Conn]: ...

    @abstractmethod
    def _rotate_tokens(self, db: Conn, batch_size: int) -> list[Any]: ...

    @abstractmethod
    def _decrypt(self, claim_id: str, name: str, key_id: str, blob: bytes, version: int) -> bytes: ...

    def rotate_keys(
        self, new_key: bool = True, *, batch_size: int = 100, max_batches: int | None = None
    ) -> int:
        """Re-encrypt every value under a new current key; returns how many were re-encrypted.

        ``new_key=False`` resumes an interrupted rotation. Each batch is its own transaction, so a
        writer waits at most one batch; ``max_batches`` stops early, leaving the rotation to be
        resumed. When no value uses a non-current key any more, those keys are retired.
        """
        if new_key:
            self._keyring.add_key()
        done = 0
        for _ in itertools.count() if max_batches is None else range(max_batches):
            with self._write() as db:
                sql = (
                    "SELECT claim_id, name, key_id, value, version FROM credentials WHERE key_id != ? LIMIT ?"
                )
                batch = db.execute(sql, (self._keyring.current, batch_size)).fetchall()
                for claim_id, name, key_id, blob, version in batch:
                    plain = self._decrypt(claim_id, name, key_id, blob, version)
                    kid, blob = self._keyring.encrypt(plain, aad(claim_id, name, version))
                    sql = "UPDATE credentials SET key_id = ?, value = ? WHERE claim_id = ? AND name = ?"
                    db.execute(sql, (kid, blob, claim_id, name))
                sql = (
                    "SELECT claim_id, name, key_id, value, version FROM credential_history "
                    "WHERE key_id != ? LIMIT ?"
                )
                old = db.execute(sql, (self._keyring.current, batch_size)).fetchall()
                for claim_id, name, key_id, blob, version in old:
                    plain = self._decrypt(claim_id, name, key_id, blob, version)
                    kid, blob = self._keyring.encrypt(plain, aad(claim_id, name, version))
                    sql = (
                        "UPDATE credential_history SET key_id = ?, value = ? "
                        "WHERE claim_id = ? AND name = ? AND version = ?"
                    )
                    db.execute(sql, (kid, blob, claim_id, name, version))
                batch += old
                batch += self._rotate_tokens(db, batch_size)  # refresh tokens (proxy.store.kinds)
            done += len(batch)
            if not batch:
                break
        else:
            return done  # stopped by max_batches: old keys are still needed
        with self._write() as db:  # writers re-read the key file inside their own transaction
            used = {r[0] for r in db.execute("SELECT DISTINCT key_id FROM credentials")}
            used |= {r[0] for r in db.execute("SELECT DISTINCT key_id FROM credential_history")}
            used |= {r[0] for r in db.execute("SELECT DISTINCT key_id FROM credential_tokens")}
            for kid in set(self._keyring.key_ids) - used - {self._keyring.current}:
                self._keyring.retire(kid)
        return done
