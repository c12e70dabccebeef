"""Records as an older helix-mesh wrote them: only the columns its schema had.

A test that opens a database of an older schema version needs sessions in it; the
current code would write columns that schema lacks (each release that adds a record
field adds one), so these write the record's values for the columns present.
"""

from __future__ import annotations

import sqlite3

import asyncpg  # type: ignore[import-untyped]

from helix_transport.store import SessionRecord
from helix_transport.store.postgres import _codec as _postgres_codec
from helix_transport.store.sqlite import _sessions as _sqlite_sessions


def insert_sqlite(conn: sqlite3.Connection, record: SessionRecord) -> None:
    """Insert ``record`` into an SQLite file of any schema version."""
    present = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
    values = {k: v for k, v in _sqlite_sessions.session_params(record).items() if k in present}
    names = ", ".join(values)
    conn.execute(
        f"INSERT INTO sessions ({names}) VALUES ({', '.join(':' + k for k in values)})", values
    )


async def insert_postgres(admin: asyncpg.Connection, schema: str, record: SessionRecord) -> None:
    """Insert ``record`` into a PostgreSQL schema of any version."""
    rows = await admin.fetch(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = $1 AND table_name = 'sessions'",
        schema,
    )
    present = {row["column_name"] for row in rows}
    values = {k: v for k, v in _postgres_codec.columns(record).items() if k in present}
    placeholders = ", ".join(f"${n}" for n in range(1, len(values) + 1))
    await admin.execute(
        f'INSERT INTO "{schema}".sessions ({", ".join(values)}) VALUES ({placeholders})',
        *values.values(),
    )
