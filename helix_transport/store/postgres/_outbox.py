"""The outbox of child commands in a PostgreSQL store: its migration and statements.

"{s}" stands for the quoted schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from helix_transport.store._records import ChildCommand, merge_commands
from helix_transport.store.postgres._conn import Database

MIGRATION = """
    -- COLLATE "C": ids compare by code point, the order list_commands promises on every
    -- backend (the database's default collation may be a language's).
    CREATE TABLE {s}.child_commands (
        parent_session_id text COLLATE "C" NOT NULL, child_session_id text COLLATE "C" NOT NULL,
        kind text COLLATE "C" NOT NULL, address text NOT NULL, reason text NOT NULL,
        created_at float8 NOT NULL, attempts bigint NOT NULL,
        PRIMARY KEY (parent_session_id, child_session_id, kind));
    CREATE INDEX child_commands_by_age ON {s}.child_commands
        (created_at, parent_session_id, child_session_id, kind);
"""
"""The migration that adds the outbox."""

_COLUMNS = [f.name for f in dataclasses.fields(ChildCommand)]
_TYPES = {"created_at": "float8", "attempts": "bigint"}
# The batch as one statement (atomic on its own), a column array per field; the batch
# must hold each key once (ON CONFLICT may not touch a row twice). A repeated command
# keeps its created_at and attempts.
_PUT = (
    f"INSERT INTO {{s}}.child_commands ({', '.join(_COLUMNS)}) SELECT * FROM unnest("
    + ", ".join(f"${n}::{_TYPES.get(c, 'text')}[]" for n, c in enumerate(_COLUMNS, start=1))
    + ") ON CONFLICT (parent_session_id, child_session_id, kind) DO UPDATE SET "
    "address = EXCLUDED.address, reason = EXCLUDED.reason"
)
_LIST = (
    f"SELECT {', '.join(_COLUMNS)} FROM {{s}}.child_commands "
    "ORDER BY created_at, parent_session_id, child_session_id, kind LIMIT $1"
)
_KEY = "parent_session_id = $1 AND child_session_id = $2 AND kind = $3"
_RECORD_ATTEMPT = f"UPDATE {{s}}.child_commands SET attempts = attempts + 1 WHERE {_KEY}"
_DELETE = f"DELETE FROM {{s}}.child_commands WHERE {_KEY}"


def _put_args(commands: Sequence[ChildCommand]) -> list[list[Any]]:
    """``_PUT``'s parameters: one array per column."""
    return [[getattr(command, c) for command in commands] for c in _COLUMNS]


def _from_row(row: Mapping[str, Any]) -> ChildCommand:
    """A command from a ``_LIST`` row."""
    return ChildCommand(**{c: row[c] for c in _COLUMNS})


class PostgresOutbox:
    """``OutboxStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put_commands(self, commands: Sequence[ChildCommand]) -> None:
        """Record ``commands`` in one statement (an upsert keeping the first
        ``created_at``; see ``Store``)."""
        merged = merge_commands(commands)
        if merged:
            await self._db.call("execute", _PUT, *_put_args(merged))

    async def list_commands(self, *, limit: int = 100) -> list[ChildCommand]:
        """Pending commands, oldest first (``created_at``, then the key), at most ``limit``."""
        if limit < 1:
            return []
        return [_from_row(row) for row in await self._db.call("fetch", _LIST, limit)]

    async def record_attempt(self, command: ChildCommand) -> None:
        """Count a failed delivery attempt; a no-op when the command is gone."""
        await self._db.call("execute", _RECORD_ATTEMPT, *command.key)

    async def delete_command(self, command: ChildCommand) -> None:
        """Drop a delivered command; a no-op when it is gone."""
        await self._db.call("execute", _DELETE, *command.key)
