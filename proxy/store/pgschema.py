"""The PostgreSQL store's schema and its migrations (``surrogate_state.schema_version``, now 3).

Tables: the SQLite store's (:mod:`proxy.store.schema`) with PostgreSQL's types (``bytea`` for
sealed values and token hashes, ``double precision`` for times, ``bigint`` for counts; JSON
columns hold JSON text, as in SQLite, so one row reader serves both; ids and names sort as
bytes, ``COLLATE "C"``, as in SQLite), plus one row of state::

    surrogate_state(id = 1, schema_version, data_version, pruned_through)
      -- data_version: bumped by every write transaction (proxy.store.postgres), which also
      -- makes that row the store-wide write lock
    claims.changed, credentials.changed  -- the data_version of the row's last write (version 2)
    removals(claim_id, name, changed)    -- a tombstone per removed claim (name NULL) or credential
    approvals, grants                    -- issue 16 (version 3), columns as in proxy.store.approvals

Since version 2, triggers stamp ``changed`` on every insert and update of a claim or credential
and write a tombstone for every delete (cascades included), so that a node reads only what
changed since the version it has (``PostgresStore.changes_since``) without the shared queries
knowing. Tombstones older than 10,000 versions are pruned (``pruned_through``); a node further
behind reads a whole snapshot.

Migrating: each open runs, in one transaction under a transaction-scoped advisory lock (two
nodes starting together do not both migrate), the base schema when ``surrogate_state`` is absent
and then ``MIGRATIONS[n]`` for every n from the stored version on; a failure leaves the database
at its old version. A database newer than this code is refused. The tables live in the first
schema of the connection's ``search_path`` (give surrogate its own database, or its own schema
with ``?options=-csearch_path%3DNAME`` in the URL).

Errors: :class:`proxy.store.base.StoreError` for a newer schema; psycopg errors pass through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.store.base import StoreError

if TYPE_CHECKING:
    import psycopg

SCHEMA_VERSION = 3
MIGRATE_LOCK = 0x5355_5252_4F47_0001  # pg_advisory_xact_lock key: "SURROG" + 1 (fits in a bigint)
SCHEMA = (
    """CREATE TABLE surrogate_state (
      id integer PRIMARY KEY CHECK (id = 1), schema_version integer NOT NULL,
      data_version bigint NOT NULL)""",
    """CREATE TABLE claims (
      id text COLLATE "C" PRIMARY KEY, pool text NOT NULL, sources text NOT NULL, token_hash bytea NOT NULL,
      version bigint NOT NULL, created_at double precision NOT NULL,
      updated_at double precision NOT NULL, interface text)""",
    """CREATE TABLE credentials (
      claim_id text COLLATE "C" NOT NULL REFERENCES claims(id) ON DELETE CASCADE,
      name text COLLATE "C" NOT NULL,
      hosts text NOT NULL, inject_header text, inject_format text, placeholder text NOT NULL UNIQUE,
      version bigint NOT NULL, created_at double precision NOT NULL,
      updated_at double precision NOT NULL, expires_at double precision,
      last_used_at double precision, key_id text NOT NULL, value bytea NOT NULL, surfaces text,
      on_misplaced text, max_requests bigint, requests_used bigint NOT NULL DEFAULT 0,
      headers text, basic_parts text, PRIMARY KEY (claim_id, name))""",
    "CREATE INDEX credentials_key_id ON credentials(key_id)",
    """CREATE TABLE credential_history (
      claim_id text NOT NULL, name text NOT NULL, version bigint NOT NULL,
      superseded_at double precision NOT NULL, key_id text NOT NULL, value bytea NOT NULL,
      PRIMARY KEY (claim_id, name, version),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE)""",
    """CREATE TABLE credential_oauth (
      claim_id text NOT NULL, name text NOT NULL, spec text NOT NULL, PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE)""",
    """CREATE TABLE rules_budgets (
      claim_id text NOT NULL, name text NOT NULL, requests_used bigint NOT NULL,
      PRIMARY KEY (claim_id, name))""",
    "INSERT INTO surrogate_state VALUES (1, 1, 0)",
)
# Tables created when absent on every open, whatever the schema version (no migration number):
# leases (proxy.store.leases), one holder at a time of a named job, by the database's clock.
SIDE_TABLES = (
    """CREATE TABLE IF NOT EXISTS leases (key text COLLATE "C" PRIMARY KEY, holder text NOT NULL,
      expires_at double precision NOT NULL)""",
    # credential kinds (issue 15, proxy.store.kinds): written with their credential's row in one
    # transaction, so the row's ``changed`` stamp carries them to every node
    """CREATE TABLE IF NOT EXISTS credential_kinds (
      claim_id text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL, kind text NOT NULL,
      spec text NOT NULL, PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE)""",
    """CREATE TABLE IF NOT EXISTS credential_tokens (
      claim_id text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL, generation bigint NOT NULL,
      updated_at double precision NOT NULL, key_id text NOT NULL, value bytea NOT NULL,
      PRIMARY KEY (claim_id, name),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE)""",
    # an aws_sigv4 spec's placeholders, one row each (proxy.store.kinds; SQLite's schema.py):
    # written with the kind row, filled from the kinds when created (SPEC_PLACEHOLDERS_FILL)
    """CREATE TABLE IF NOT EXISTS credential_spec_placeholders (
      claim_id text COLLATE "C" NOT NULL, name text COLLATE "C" NOT NULL,
      placeholder text COLLATE "C" NOT NULL, PRIMARY KEY (claim_id, placeholder),
      FOREIGN KEY (claim_id, name) REFERENCES credentials(claim_id, name) ON DELETE CASCADE)""",
    """CREATE INDEX IF NOT EXISTS credential_spec_placeholders_of
      ON credential_spec_placeholders(claim_id, name)""",
    # fleet-wide limits (proxy.store.fleetlimits): heartbeats, connection counts, rate buckets
    """CREATE TABLE IF NOT EXISTS fleet_nodes (run text COLLATE "C" NOT NULL, worker integer NOT NULL,
      node text NOT NULL, heartbeat double precision NOT NULL, PRIMARY KEY (run, worker))""",
    """CREATE TABLE IF NOT EXISTS fleet_gauges (run text COLLATE "C" NOT NULL, worker integer NOT NULL,
      claim text COLLATE "C" NOT NULL, count integer NOT NULL, PRIMARY KEY (run, worker, claim),
      FOREIGN KEY (run, worker) REFERENCES fleet_nodes(run, worker) ON DELETE CASCADE)""",
    """CREATE TABLE IF NOT EXISTS fleet_buckets (claim text COLLATE "C" PRIMARY KEY,
      tokens double precision NOT NULL, stamp double precision NOT NULL,
      granted double precision NOT NULL, full_at double precision NOT NULL)""",
)
# fills credential_spec_placeholders from the kinds written before it existed
SPEC_PLACEHOLDERS_FILL = (
    """INSERT INTO credential_spec_placeholders SELECT claim_id, name, spec::json ->> 'secret_placeholder'
      FROM credential_kinds WHERE kind = 'aws_sigv4' AND spec::json ->> 'secret_placeholder' IS NOT NULL
      ON CONFLICT DO NOTHING""",
    """INSERT INTO credential_spec_placeholders SELECT claim_id, name,
      spec::json ->> 'session_token_placeholder' FROM credential_kinds WHERE kind = 'aws_sigv4'
      AND spec::json ->> 'session_token_placeholder' IS NOT NULL ON CONFLICT DO NOTHING""",
)
# MIGRATIONS[n] takes a database from schema version n to n + 1 (a new database runs them all).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (  # incremental re-reads (PostgresStore.changes_since): each row says at which version it
        # last changed, a removal leaves a tombstone; triggers stamp them, so the shared queries
        # need not know. A row's stamp is the data_version its write transaction bumped to.
        "ALTER TABLE surrogate_state ADD COLUMN pruned_through bigint NOT NULL DEFAULT 0",
        "ALTER TABLE claims ADD COLUMN changed bigint NOT NULL DEFAULT 0",
        "ALTER TABLE credentials ADD COLUMN changed bigint NOT NULL DEFAULT 0",
        "CREATE INDEX claims_changed ON claims(changed)",
        "CREATE INDEX credentials_changed ON credentials(changed)",
        """CREATE TABLE removals (claim_id text COLLATE "C" NOT NULL, name text COLLATE "C",
          changed bigint NOT NULL)""",  # name NULL: the claim itself
        "CREATE INDEX removals_changed ON removals(changed)",
        """CREATE FUNCTION surrogate_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN NEW.changed := (SELECT data_version FROM surrogate_state); RETURN NEW; END $$""",
        """CREATE FUNCTION surrogate_removed() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF TG_TABLE_NAME = 'claims' THEN
              INSERT INTO removals SELECT OLD.id, NULL, data_version FROM surrogate_state;
            ELSE
              INSERT INTO removals SELECT OLD.claim_id, OLD.name, data_version FROM surrogate_state;
            END IF;
            RETURN OLD;
          END $$""",
        """CREATE TRIGGER claims_stamp BEFORE INSERT OR UPDATE ON claims
          FOR EACH ROW EXECUTE FUNCTION surrogate_stamp()""",
        """CREATE TRIGGER credentials_stamp BEFORE INSERT OR UPDATE ON credentials
          FOR EACH ROW EXECUTE FUNCTION surrogate_stamp()""",
        """CREATE TRIGGER claims_removed AFTER DELETE ON claims
          FOR EACH ROW EXECUTE FUNCTION surrogate_removed()""",
        """CREATE TRIGGER credentials_removed AFTER DELETE ON credentials
          FOR EACH ROW EXECUTE FUNCTION surrogate_removed()""",
    ),
    2: (  # approvals and grants (issue 16, proxy.store.approvals); no triggers: not synced data
        """CREATE TABLE approvals (
          id text COLLATE "C" PRIMARY KEY, claim_id text NOT NULL, pool text NOT NULL,
          method text NOT NULL, host text NOT NULL, port integer NOT NULL, path text NOT NULL,
          credentials text NOT NULL, preview text NOT NULL, rule text NOT NULL, scopes text NOT NULL,
          created_at double precision NOT NULL, expires_at double precision NOT NULL,
          state text NOT NULL, decided_at double precision, decided_by text, scope text,
          reason text, session text, request_id text)""",
        "CREATE INDEX approvals_state ON approvals(state)",
        """CREATE TABLE grants (
          id text COLLATE "C" PRIMARY KEY, claim_id text NOT NULL, credentials text NOT NULL,
          method text NOT NULL, host text NOT NULL, port integer NOT NULL, path_prefix text NOT NULL,
          scope text NOT NULL, created_at double precision NOT NULL, expires_at double precision,
          approved_by text NOT NULL, session text, revoked_at double precision, revoked_by text,
          approval_id text)""",
        "CREATE INDEX grants_claim ON grants(claim_id, host)",
    ),
}


def migrate(conn: psycopg.Connection[tuple[Any, ...]], where: str) -> None:
    """Create or migrate the schema, in one transaction of ``conn`` (an autocommit connection).
    ``where`` names the database in messages. Raises StoreError for a newer schema."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        row = conn.execute("SELECT to_regclass('surrogate_state') IS NOT NULL").fetchone()
        if not (row and row[0]):
            for statement in SCHEMA:
                conn.execute(statement.encode())
        found_row = conn.execute("SELECT schema_version FROM surrogate_state").fetchone()
        found = int(found_row[0]) if found_row else 0
        if not 1 <= found <= SCHEMA_VERSION:
            raise StoreError(
                f"store {where} has schema version {found}; this surrogate reads up to {SCHEMA_VERSION}"
            )
        for step in range(found, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement.encode())
        conn.execute("UPDATE surrogate_state SET schema_version = %s", (SCHEMA_VERSION,))
        row = conn.execute("SELECT to_regclass('credential_spec_placeholders') IS NOT NULL").fetchone()
        filled = bool(row and row[0])
        for statement in SIDE_TABLES:
            conn.execute(statement.encode())
        for statement in () if filled else SPEC_PLACEHOLDERS_FILL:
            conn.execute(statement.encode())
