"""The fleet's credential store: the same interface (:class:`proxy.store.base.CredentialStore`)
and the same queries (:mod:`proxy.store.queries`) as the SQLite store, on a PostgreSQL database
that every node shares (psycopg 3 and its connection pool).

Selected with ``--store postgresql://USER@HOST:PORT/DB[?OPTIONS]`` (:func:`parse_url`). The
password never travels in the URL: a URL that holds one (``user:pw@``, ``?password=``) is
refused, as argv is readable by every local user and lands in shell histories and process
listings. It comes from libpq's own sources (``PGPASSWORD``, ``PGPASSFILE`` / ``~/.pgpass``,
``passfile=``) or from ``password_file=PATH``, a file that holds the password alone (a mounted
Kubernetes Secret), read once when the store opens.

Values are sealed exactly as in the SQLite store (AES-256-GCM under the key file, associated data
``claim_id NUL name NUL version``): every node must hold the same key file. Opening refuses a
key file that lacks a key the database's values are sealed under (a node with its own fresh key
would seal values no other node can read, and read none of theirs).

Transactions:

- A write (:meth:`PostgresStore._write`) first bumps ``surrogate_state.data_version``: that row
  lock serialises writers of every node, as SQLite's ``BEGIN IMMEDIATE`` does on one machine, so
  a compare-and-set is exact fleet-wide (READ COMMITTED: each later statement sees every write
  committed before the lock was granted); the key file is re-read once the lock is held. It
  commits with ``synchronous_commit = on`` whatever the server's default, so an acknowledged
  write is on disk. A lock not granted within 5 s is a StoreError (``lock_timeout``).
- Budgets are counted in one conditional ``UPDATE`` / ``INSERT ... ON CONFLICT`` (row locks,
  re-checked by PostgreSQL after a wait), so a budget of N is never exceeded across nodes; they
  do not bump ``data_version`` (nothing a node must re-read changed), nor does ``touch_used``.
- :meth:`PostgresStore.snapshot` reads in one REPEATABLE READ, READ ONLY transaction.

Change detection, decided: by default (``sync=strict``) :meth:`data_version` reads the version
row on each call (one round trip; the registry asks at the start of each request), so an
acknowledged write is used by the very next request on every node. With ``?sync=notify`` (and
``poll=SECONDS``, default 1) a node keeps the version from LISTEN/NOTIFY and a poll
(:mod:`proxy.store.pgwatch`): no round trip per request, and another node's write is seen within
the notification's latency (milliseconds) or, when one is lost, one poll; this node's own writes
at once. A node that cannot reach the database gets StoreError, and the registry keeps serving
its last-known-good copy for at most ``stale=SECONDS`` (default 30, 1 to 3600) after it was last
known current (:meth:`data_version_at`; :mod:`proxy.store.freshness`), then refuses store
claims' requests (``store_stale``). The version read waits at most 0.5 s for a connection.

Opening, decided: ``surrogate run`` opens the store with ``wait=False``: when the database
cannot be reached it starts anyway (the pool connects in the background), refuses store claims
(``store_never_synced``) and answers ``/readyz`` 503 until the first read succeeds; the schema
check and the key-file check then run before that first read (a failing one keeps the node
unsynced, logged). Every other command (``control``, ``admin``) still fails at once.
Re-reads are incremental: :meth:`PostgresStore.changes_since` gives the rows written and removed
after a version (stamped by triggers, :mod:`proxy.store.pgschema`), and the registry applies
them, so one write costs each node the rows it wrote, not a snapshot of every credential.

Errors: every psycopg error becomes :class:`proxy.store.base.StoreError` naming the database
(host, port, database; never the password); a bad URL is a ValueError.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo, pq
from psycopg_pool import ConnectionPool, PoolTimeout

from proxy.store import pgschema, rows
from proxy.store.base import Changes, Cursor, StoreError
from proxy.store.keyring import KeyRing
from proxy.store.leases import take_statement
from proxy.store.pgwatch import CHANNEL, Watcher
from proxy.store.queries import SQLStore

SCHEMES = ("postgresql", "postgres")
log = logging.getLogger(__name__)
_TOUCH_EVERY = 1.0  # seconds, as in the SQLite store
_LOCK_TIMEOUT = "5s"  # SQLite's busy_timeout
_CONNECT_TIMEOUT = 10.0
_VERSION_TIMEOUT = 0.5  # seconds a version read waits for a pooled connection (on the event loop)
_PARAM = re.compile(r":([A-Za-z_]\w*)")
_OWN = ("password_file", "sync", "poll", "stale")  # surrogate's options in the URL, not libpq's
_PRUNE_EVERY = 1000  # versions
_QUOTED = re.compile(r'"[^"]*"')
_SHOWN = ("host", "hostaddr", "port", "dbname", "user")  # named in errors; every other value is blanked
# libpq's secret options: those it marks as password fields ("*": oauth_client_secret,
# sslpassword, password), and the SCRAM keys, which authenticate as the password does
_MARKED = frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*")
_ALWAYS = {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
SECRET_OPTIONS = _MARKED | _ALWAYS
_TOMBSTONE_VERSIONS = 10_000  # a node further behind than this reads a whole snapshot
# the column orders proxy.store.rows reads, spelled out: whole statements, never built
_CHANGED_CLAIMS = """SELECT id, pool, sources, version, created_at, updated_at, interface FROM claims
    WHERE changed > ? ORDER BY id"""
_CHANGED_CREDS = """SELECT claim_id, name, hosts, inject_header, inject_format, placeholder, version,
    created_at, updated_at, expires_at, last_used_at, surfaces, on_misplaced, max_requests,
    requests_used, headers, basic_parts,
    (SELECT kind FROM credential_kinds k WHERE k.claim_id = credentials.claim_id
    AND k.name = credentials.name), (SELECT spec FROM credential_kinds k
    WHERE k.claim_id = credentials.claim_id AND k.name = credentials.name)
    FROM credentials WHERE changed > ? ORDER BY claim_id, name"""


def is_url(text: str) -> bool:
    return urlsplit(text).scheme in SCHEMES


@dataclass(frozen=True, slots=True, repr=False)  # no repr: it would show the password
class Target:
    conninfo: str  # the libpq connection string, without surrogate's own options
    password: str | None  # read from password_file; None: libpq finds it (PGPASSWORD, .pgpass)
    where: str  # HOST:PORT/DB, for messages
    sync: str = "strict"  # "strict": read the version on each call; "notify": LISTEN/NOTIFY + poll
    poll: float = 1.0  # seconds between version polls in "notify" mode
    hide: tuple[str, ...] = ()  # the URL's option values, never echoed in an error (libpq quotes them)
    stale: float = 30.0  # seconds a node serves its last-known-good copy (proxy.store.freshness)


def parse_url(url: str) -> Target:
    """The :class:`Target` of a ``postgresql://`` URL. Surrogate's own options are taken out of
    the query before libpq reads it: ``password_file=PATH``, ``sync=strict|notify`` and
    ``poll=SECONDS`` (``notify`` only; 0.05 to 60), ``stale=SECONDS`` (1 to 3600, default 30).

    Raises ValueError, never echoing the URL or a part of it (a password may have been pasted
    anywhere in it): a password or another secret libpq reads (:data:`SECRET_OPTIONS`) in the
    URL, another scheme, a fragment, an option libpq does not know, an unreadable or empty
    ``password_file``.
    """
    try:
        parts = urlsplit(url)
        userinfo_password = parts.password
    except ValueError:  # urllib quotes the offending part
        raise ValueError("the store URL is not a URL (postgresql://USER@HOST:PORT/DB)") from None
    if parts.scheme not in SCHEMES:
        raise ValueError("a store URL starts with postgresql://")
    if parts.fragment or url.endswith("#"):
        raise ValueError("the store URL has a #fragment, which libpq does not read")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if userinfo_password is not None or any(k == "password" for k, _ in query):
        raise ValueError(
            "the store URL holds a password: it would be readable in the process list; use "
            "password_file=PATH in the URL, PGPASSFILE or ~/.pgpass, or PGPASSWORD"
        )
    own = {k: v for k, v in query if k in _OWN}
    rest = [(k, v) for k, v in query if k not in _OWN]
    sync, poll = own.get("sync", "strict"), own.get("poll", "1")
    if sync not in ("strict", "notify"):
        raise ValueError("sync= in the store URL: expected strict or notify")
    try:
        seconds = float(poll)
    except ValueError:
        seconds = -1.0
    if not 0.05 <= seconds <= 60:
        raise ValueError("poll= in the store URL: expected seconds from 0.05 to 60")
    try:
        stale = float(own.get("stale", "30"))
    except ValueError:
        stale = -1.0
    if not 1 <= stale <= 3600:
        raise ValueError("stale= in the store URL: expected seconds from 1 to 3600")
    text = urlunsplit(parts._replace(query=urlencode(rest)))
    try:
        params = conninfo.conninfo_to_dict(text)
    except psycopg.Error as e:
        raise ValueError(f"the store URL is not a libpq URL: {_first_line(e, quoted=True)}") from None
    if "password" in params:  # any spelling libpq reads as one
        raise ValueError("the store URL holds a password; use password_file=PATH, PGPASSFILE or PGPASSWORD")
    if secret := sorted(SECRET_OPTIONS & params.keys()):
        raise ValueError(
            f"the store URL holds a secret ({', '.join(secret)}): it would be readable in the process "
            "list; give it in a service file (service=) or libpq's environment variable"
        )
    password = None
    if "password_file" in own:
        path = Path(own["password_file"])
        try:
            password = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"password_file {path}: {getattr(e, 'strerror', None) or e}") from None
        if not password:
            raise ValueError(f"password_file {path} is empty")
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname') or ''}"
    hide = tuple(str(v) for k, v in params.items() if k not in _SHOWN and str(v))
    return Target(text, password, where, sync, seconds, hide, stale)


def _first_line(e: BaseException, hide: tuple[str, ...] = (), *, quoted: bool = False) -> str:
    """The error's first line, with ``hide``'s values (and, ``quoted``, every quoted token) blanked."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    for value in sorted(hide, key=len, reverse=True):
        line = line.replace(value, "...")
    return _QUOTED.sub('"..."', line) if quoted else line


def _qmark(sql: str) -> bytes:
    """The shared queries' ``?`` and ``:name`` parameters in psycopg's ``%s`` / ``%(name)s``."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%").replace("?", "%s")).encode()


class _Conn:
    """A psycopg connection that reads the shared queries' parameter style."""

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self._conn = conn
        self._cache: dict[str, bytes] = {}

    def execute(self, sql: str, params: Any = (), /) -> Cursor:
        query = self._cache.get(sql)
        if query is None:
            query = self._cache[sql] = _qmark(sql)
        args = params if isinstance(params, Mapping) else tuple(params)
        return self._conn.execute(query, args)


class PostgresStore(SQLStore):
    """The credential store on a PostgreSQL database shared by a fleet; thread-safe (a pool)."""

    _errors: ClassVar[tuple[type[Exception], ...]] = (psycopg.Error,)
    # the database's clock, one for every node (no "::" cast: _qmark would read it as a parameter)
    _LEASE_TAKE: ClassVar[str] = take_statement(
        "CAST(extract(epoch FROM clock_timestamp()) AS double precision)"
    )

    def __init__(self, pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]], keyring: KeyRing,
                 where: str, watcher: Watcher | None = None, hide: tuple[str, ...] = ()) -> None:  # fmt: skip
        self._pool = pool
        self._hide = hide  # the URL's option values: blanked in errors
        self._watcher = watcher
        self._keyring = keyring
        self.where = where
        self._touched: dict[tuple[str, str], float] = {}
        self._touch_lock = threading.Lock()
        self.stale_after = 30.0  # seconds: the staleness bound (parse_url's stale=)
        self._pending = False  # opened without the database: schema and keys still to check
        self._setup_lock = threading.Lock()

    @classmethod
    def open(cls, url: str, keyring: KeyRing, *, max_size: int = 4, wait: bool = True) -> PostgresStore:
        """Connect (waiting up to 10 s), create or migrate the schema, and check that the key
        file holds every key the stored values use. ValueError for a bad URL, StoreError else.
        ``wait=False``: a database that cannot be reached is no error; the schema and key checks
        run before the first use that reaches it (module docstring, "Opening")."""
        target = parse_url(url)
        text, where = target.conninfo, target.where
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": int(_CONNECT_TIMEOUT)}
        if target.password is not None:
            kwargs["password"] = target.password
        later = False
        try:  # one direct connection first: a clear error at once, not a pool's retries
            with psycopg.connect(text, **kwargs) as conn:
                pgschema.migrate(conn, where)
        except psycopg.OperationalError as e:
            if wait:
                raise StoreError(f"cannot open store {where}: {_first_line(e, target.hide)}") from None
            log.warning("store %s unreachable at start (%s): not synced until it answers", where,
                        _first_line(e, target.hide))  # fmt: skip
            later = True
        except psycopg.Error as e:
            raise StoreError(f"cannot open store {where}: {_first_line(e, target.hide)}") from None
        pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
            text, kwargs=kwargs, min_size=1, max_size=max_size, open=False, configure=_configure,
            name="surrogate-store", timeout=_CONNECT_TIMEOUT,
        )  # fmt: skip
        try:
            pool.open(wait=not later, timeout=_CONNECT_TIMEOUT)
        except (PoolTimeout, psycopg.Error) as e:
            pool.close()
            raise StoreError(f"cannot open store {where}: {_first_line(e, target.hide)}") from None
        watcher = None
        if target.sync == "notify":
            watch_kwargs = {**kwargs, "application_name": "surrogate-watch"}
            watcher = Watcher(lambda: psycopg.connect(text, **watch_kwargs), target.poll).start()
        store = cls(pool, keyring, where, watcher, target.hide)
        store.stale_after = target.stale
        if later:
            store._pending = True
            return store
        try:
            store._check_keys()
        except BaseException:
            store.close()
            raise
        return store

    def _check_keys(self) -> None:
        used = {r[0] for r in self._all("SELECT DISTINCT key_id FROM credentials")}
        used |= {r[0] for r in self._all("SELECT DISTINCT key_id FROM credential_history")}
        used |= {r[0] for r in self._all("SELECT DISTINCT key_id FROM credential_tokens")}
        if missing := sorted(used - set(self._keyring.key_ids)):
            raise StoreError(
                f"store {self.where} holds values sealed under key {', '.join(missing)}, which key file "
                f"{self._keyring.path} lacks: every node must use the same key file"
            )

    def _stateless(self) -> StoreError:
        """The one row of state, made with the schema, was deleted by hand."""
        return StoreError(f"store {self.where} has no surrogate_state row: restore it")

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore(where={self.where!r})"

    def _set_up(self) -> None:
        """Opened without the database (``wait=False``): the schema and key checks, once."""
        with self._setup_lock:
            if not self._pending:
                return
            try:
                with self._pool.connection(timeout=_VERSION_TIMEOUT) as conn:
                    pgschema.migrate(conn, self.where)
            except (PoolTimeout, psycopg.Error) as e:
                raise StoreError(f"store {self.where}: {_first_line(e, self._hide)}") from None
            self._pending = False
            try:
                self._check_keys()
            except StoreError:
                self._pending = True  # checked again on the next use: the node stays unsynced
                raise

    @contextmanager
    def _connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        if self._pending:
            self._set_up()
        try:
            with self._pool.connection(timeout=timeout) as conn:
                yield conn
        except (PoolTimeout, psycopg.Error) as e:
            raise StoreError(f"store {self.where}: {_first_line(e, self._hide)}") from None

    @contextmanager
    def _write(self) -> Iterator[_Conn]:
        with self._connection() as conn:
            with conn.transaction():
                row = conn.execute(
                    "UPDATE surrogate_state SET data_version = data_version + 1 RETURNING data_version"
                ).fetchone()
                if row is None:  # the one row of state, made with the schema, was deleted by hand
                    raise self._stateless()
                self._keyring.refresh()
                yield _Conn(conn)
                if row[0] % _PRUNE_EVERY == 0:  # tombstones a reader this far behind no longer needs
                    horizon = row[0] - _TOMBSTONE_VERSIONS
                    conn.execute("DELETE FROM removals WHERE changed <= %s", (horizon,))
                    conn.execute(
                        "UPDATE surrogate_state SET pruned_through = GREATEST(pruned_through, %s)", (horizon,)
                    )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(row[0])))  # sent on commit
            if self._watcher is not None:
                self._watcher.saw(int(row[0]))  # this node's next request sees its own write

    @contextmanager
    def _count(self) -> Iterator[_Conn]:
        with self._connection() as conn, conn.transaction():
            yield _Conn(conn)

    @contextmanager
    def _auto(self) -> Iterator[_Conn]:
        with self._connection() as conn:
            yield _Conn(conn)

    @contextmanager
    def _snapshot(self) -> Iterator[_Conn]:
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield _Conn(conn)

    def data_version(self) -> int:
        """``surrogate_state.data_version``: bumped by every write of any node. With
        ``sync=notify`` the watcher's confirmed copy (:mod:`proxy.store.pgwatch`), else (and
        whenever that copy is older than 2 × poll) read from the database."""
        return self.data_version_at()[0]

    def data_version_at(self) -> tuple[int, float]:
        """:meth:`data_version` and the ``time.monotonic()`` at which it was known current (the
        read's start, or the watcher's last confirmation): the staleness bound counts from it."""
        if self._watcher is not None and (cached := self._watcher.confirmed()) is not None:
            return cached
        started = time.monotonic()
        with self._connection(_VERSION_TIMEOUT) as conn:
            row = conn.execute(b"SELECT data_version FROM surrogate_state").fetchone()
        if row is None:
            raise self._stateless()
        version = int(row[0])
        if self._watcher is not None:
            self._watcher.saw(version)
        return version, started

    def changes_since(self, version: int) -> Changes | None:
        """The rows written and removed after ``version``, read in one snapshot; None when the
        tombstones of that time are pruned (or the database is older than ``version``, as after
        a restore): the caller then reads a whole :meth:`snapshot`."""
        with self._snapshot() as db:
            state = db.execute("SELECT data_version, pruned_through FROM surrogate_state").fetchone()
            if state is None:
                raise self._stateless()
            now, pruned = state
            if not pruned <= version <= now:
                return None
            claims = [rows.claim(r) for r in db.execute(_CHANGED_CLAIMS, (version,))]
            creds = [rows.cred(r) for r in db.execute(_CHANGED_CREDS, (version,))]
            removed = db.execute(
                "SELECT claim_id, name FROM removals WHERE changed > ?", (version,)
            ).fetchall()
            specs = db.execute("SELECT claim_id, name, spec FROM credential_oauth").fetchall()
        return Changes(
            int(now), claims, creds, [c for c, n in removed if n is None],
            [(c, n) for c, n in removed if n is not None], {(c, n): json.loads(v) for c, n, v in specs},
        )  # fmt: skip

    def touch_used(self, claim_id: str, name: str, at: float) -> None:
        """Record a use: at most one write a second per credential; skipped (no wait) while a
        writer holds the credential's row, and when the database is unreachable."""
        with self._touch_lock:
            if at - self._touched.get((claim_id, name), float("-inf")) < _TOUCH_EVERY:
                return
            self._touched[claim_id, name] = at
        try:
            with self._pool.connection(timeout=1.0) as conn, conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '10ms'")
                conn.execute(
                    "UPDATE credentials SET last_used_at = %s WHERE claim_id = %s AND name = %s "
                    "AND (last_used_at IS NULL OR last_used_at <= %s)",
                    (at, claim_id, name, at - _TOUCH_EVERY),
                )
        except (PoolTimeout, psycopg.Error):
            pass  # a hint, not worth a stall: a later use records it


def _configure(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Every pooled connection: durable commits and bounded lock waits, whatever the server says."""
    conn.execute(f"SET synchronous_commit = on; SET lock_timeout = '{_LOCK_TIMEOUT}'".encode())
