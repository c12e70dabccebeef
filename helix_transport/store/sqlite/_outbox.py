"""The outbox of child commands in an SQLite store: its table and statements.

The functions run on the store's worker thread, inside the caller's transaction.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence

from helix_transport.store._records import ChildCommand

UPGRADE: tuple[str, ...] = (
    # TEXT compares by its UTF-8 bytes (BINARY), which is code point order: the order
    # list_commands promises on every backend.
    """CREATE TABLE child_commands (
    parent_session_id TEXT NOT NULL, child_session_id TEXT NOT NULL, kind TEXT NOT NULL,
    address TEXT NOT NULL, reason TEXT NOT NULL, created_at REAL NOT NULL,
    attempts INTEGER NOT NULL,
    PRIMARY KEY (parent_session_id, child_session_id, kind)
) WITHOUT ROWID""",
    "CREATE INDEX child_commands_by_age ON child_commands "
    "(created_at, parent_session_id, child_session_id, kind)",
)
"""The schema upgrade that adds the outbox."""

_COLUMNS = [f.name for f in dataclasses.fields(ChildCommand)]
# A repeated command keeps its created_at and attempts.
_PUT = (
    f"INSERT INTO child_commands ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    "ON CONFLICT (parent_session_id, child_session_id, kind) DO UPDATE SET "
    "address = excluded.address, reason = excluded.reason"
)
_LIST = (
    f"SELECT {', '.join(_COLUMNS)} FROM child_commands "
    "ORDER BY created_at, parent_session_id, child_session_id, kind LIMIT ?"
)
_KEY = "parent_session_id = ? AND child_session_id = ? AND kind = ?"
_RECORD_ATTEMPT = f"UPDATE child_commands SET attempts = attempts + 1 WHERE {_KEY}"
_DELETE = f"DELETE FROM child_commands WHERE {_KEY}"


def put(conn: sqlite3.Connection, commands: Sequence[ChildCommand]) -> None:
    """Upsert ``commands`` (already merged by key), inside the caller's transaction."""
    conn.executemany(_PUT, [dataclasses.asdict(command) for command in commands])


def list_commands(conn: sqlite3.Connection, limit: int) -> list[ChildCommand]:
    """At most ``limit`` commands, oldest first."""
    return [
        ChildCommand(**dict(zip(_COLUMNS, row, strict=True)))
        for row in conn.execute(_LIST, (limit,))
    ]


def record_attempt(conn: sqlite3.Connection, command: ChildCommand) -> None:
    """``attempts += 1`` on the stored command with ``command``'s key, if any."""
    conn.execute(_RECORD_ATTEMPT, command.key)


def delete(conn: sqlite3.Connection, command: ChildCommand) -> None:
    """Drop the stored command with ``command``'s key, if any."""
    conn.execute(_DELETE, command.key)
