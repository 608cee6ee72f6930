"""What a node keeps: the credential store, its keys, and the state built from it.

:mod:`proxy.store.base` is the credential store's interface (records, errors, operations);
:mod:`proxy.store.sqlite` its embedded backend (SQLite, WAL; values sealed with AES-256-GCM) over
the queries every backend shares (:mod:`proxy.store.queries`; schema in :mod:`proxy.store.schema`,
row checks and sealing data in :mod:`proxy.store.rows`, key rotation in :mod:`proxy.store.rotation`);
:mod:`proxy.store.keyring` its keys; :mod:`proxy.store.registry` turns store rows into the core's
claims and credentials; :mod:`proxy.store.live` says which values of a credential scrubbing must
still catch; :mod:`proxy.store.counters` is the node-wide table of connection counts and rate
buckets every worker shares. :mod:`proxy.store.postgres` is the fleet's store on PostgreSQL, behind the
same interface and queries (schema in :mod:`proxy.store.pgschema`, change propagation in
:mod:`proxy.store.pgwatch`); :mod:`proxy.store.choose` opens the one a command names (``--store``).
Credential kinds (issue 15): :mod:`proxy.store.kinds` keeps a kind's spec and refresh token
beside the credential, :mod:`proxy.store.kindbuild` turns them into the core's signing/minting.
May import: :mod:`proxy.core`.

``from proxy.store import Store`` and the other names of the flat ``proxy.store`` module of
earlier releases still work (forwarded to :mod:`proxy.store.sqlite`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.store.sqlite")
