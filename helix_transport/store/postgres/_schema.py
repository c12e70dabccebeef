"""The PostgreSQL store's schema: numbered migrations and applying them."""

from __future__ import annotations

from typing import Any

from helix_transport._exceptions import StoreError
from helix_transport.store.postgres import _inputs as inputs
from helix_transport.store.postgres import _listing as listing
from helix_transport.store.postgres import _outbox as outbox
from helix_transport.store.postgres import _retention as retention

# Migration N is _MIGRATIONS[N - 1]; "{s}" stands for the quoted schema. Never edit
# a released migration: append a new one, so every database walks the same path.
_MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema. Column names are the record fields' names.
    """
    CREATE TABLE {s}.sessions (
        session_id text PRIMARY KEY, agent_type text NOT NULL, input_json text NOT NULL,
        input_hash text NOT NULL, status text NOT NULL, parent_session_id text NOT NULL,
        metadata jsonb NOT NULL, output_json text NOT NULL, error text NOT NULL,
        failure_reason text NOT NULL, step_count integer NOT NULL, usage jsonb NOT NULL,
        last_sequence bigint NOT NULL, created_at float8 NOT NULL, updated_at float8 NOT NULL,
        finished_at float8, owner text NOT NULL, lease_expires_at float8 NOT NULL);
    -- Startup scans for RUNNING sessions to resume, oldest first.
    CREATE INDEX sessions_by_status ON {s}.sessions (status, created_at);
    CREATE TABLE {s}.events (session_id text NOT NULL, sequence bigint NOT NULL,
        data bytea NOT NULL, PRIMARY KEY (session_id, sequence));
    -- json, not jsonb: it keeps the text exactly, and jsonb refuses "\\u0000",
    -- which tool outputs in a conversation can contain.
    CREATE TABLE {s}.checkpoints (session_id text PRIMARY KEY, step integer NOT NULL,
        messages json NOT NULL, usage jsonb NOT NULL, last_sequence bigint NOT NULL,
        state json NOT NULL);
    CREATE TABLE {s}.interrupts (session_id text PRIMARY KEY, reason text NOT NULL);
    -- position keeps the order refs were first stored; remote_* are NULL for a local child.
    CREATE TABLE {s}.subsession_refs (position bigserial NOT NULL,
        parent_session_id text NOT NULL, child_session_id text NOT NULL,
        agent_type text NOT NULL, tool_call_id text NOT NULL, status text NOT NULL,
        address text NOT NULL, started_at float8 NOT NULL, completed_at float8,
        remote_stream_id text, remote_last_sequence bigint, output_json text NOT NULL,
        error text NOT NULL, failure_reason text NOT NULL,
        PRIMARY KEY (parent_session_id, child_session_id));
    CREATE INDEX subsession_refs_by_position ON {s}.subsession_refs (parent_session_id, position);
    """,
    # 2: sessions belong to the principal (and tenant) that started them.
    """
    ALTER TABLE {s}.sessions ADD COLUMN principal text NOT NULL DEFAULT '',
        ADD COLUMN tenant text NOT NULL DEFAULT '';
    """,
    # 3: the outbox of commands for children (interrupts a child's service must take).
    outbox.MIGRATION,
    # 4: retention (an index of finished sessions by their end, tombstones).
    retention.MIGRATION,
    # 5: an index on (owner, created_at) for ListSessions.
    listing.MIGRATION,
    # 6: people's answers to requests for input; interrupts that abort.
    inputs.MIGRATION,
    # 7: a session's limits (StartRequest.limits) and which one ended it.
    """
    ALTER TABLE {s}.sessions ADD COLUMN deadline float8, ADD COLUMN budget_tokens bigint,
        ADD COLUMN budget_usd float8, ADD COLUMN limit_exceeded text NOT NULL DEFAULT '';
    """,
)

SCHEMA_VERSION = len(_MIGRATIONS)
"""The newest migration this module knows; a schema migrated further is refused."""

# First key of the two-key advisory lock taken while migrating (the second is the
# schema's hash), so the lock cannot collide with an application's own advisory locks.
_MIGRATION_LOCK_CLASS = 0x48E11C


async def migrate(conn: Any, schema: str, s: str) -> None:
    """Create ``schema`` (quoted: ``s``) if needed and apply the migrations it lacks, in
    order, inside the caller's transaction on ``conn``."""
    lock = "SELECT pg_advisory_xact_lock($1, hashtext($2))"
    await conn.execute(lock, _MIGRATION_LOCK_CLASS, schema)
    # Checked first because CREATE SCHEMA IF NOT EXISTS needs the CREATE
    # privilege even when the schema exists (a DBA may have made it for us).
    exists = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)"
    if not await conn.fetchval(exists, schema):
        await conn.execute(f"CREATE SCHEMA {s}")
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {s}.schema_migrations (version integer "
        "PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    rows = await conn.fetch(f"SELECT version FROM {s}.schema_migrations")
    applied = {row["version"] for row in rows}
    newest = max(applied, default=0)
    if newest > SCHEMA_VERSION:
        raise StoreError(
            f"schema {schema!r} has schema version {newest}; this "
            f"helix-mesh understands up to {SCHEMA_VERSION}: upgrade helix-mesh"
        )
    for version, sql in enumerate(_MIGRATIONS, start=1):
        if version not in applied:
            await conn.execute(sql.replace("{s}", s))
            insert = f"INSERT INTO {s}.schema_migrations (version) VALUES ($1)"
            await conn.execute(insert, version)
