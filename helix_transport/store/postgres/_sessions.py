"""Session records in a PostgreSQL store: the ``sessions`` table."""

from __future__ import annotations

import time
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound
from helix_transport.store._base import check_lease
from helix_transport.store._records import SessionRecord, SessionUpdate
from helix_transport.store.postgres._codec import (
    DB_NOW,
    SESSION_COLUMNS,
    columns,
    session_from_row,
    upsert,
)
from helix_transport.store.postgres._conn import Database

_INSERT_SESSION = upsert("sessions", SESSION_COLUMNS, ("session_id",), replace=False)
# _INSERT_SESSION, leased: the lease_expires_at parameter is the TTL, added to the
# database's clock (as ``acquire_lease`` does).
_INSERT_SESSION_LEASED = (
    f"INSERT INTO {{s}}.sessions ({', '.join(SESSION_COLUMNS)}) VALUES ("
    + ", ".join(
        f"{DB_NOW} + ${n}::double precision" if column == "lease_expires_at" else f"${n}"
        for n, column in enumerate(SESSION_COLUMNS, start=1)
    )
    + ") ON CONFLICT (session_id) DO NOTHING RETURNING *"
)
_GET_SESSION = "SELECT * FROM {s}.sessions WHERE session_id = $1"
_LIST_SESSIONS = "SELECT * FROM {s}.sessions WHERE status = $1 ORDER BY created_at, session_id"


class PostgresSessions:
    """``SessionStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        """Create ``record`` unless its id exists (see ``Store.create_session``)."""
        check_lease(record, lease_ttl_s)
        if lease_ttl_s is None:
            row = await self._db.call("fetchrow", _INSERT_SESSION, *columns(record).values())
        else:
            values = columns(record) | {"lease_expires_at": lease_ttl_s}
            row = await self._db.call("fetchrow", _INSERT_SESSION_LEASED, *values.values())
        if row is not None:
            return session_from_row(row), True
        # The INSERT waited for a racing creator to commit, so a new statement sees its row.
        existing = await self.get_session(record.session_id)
        if existing is None:
            raise SessionNotFound(record.session_id)
        return existing, False

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when it does not exist."""
        row = await self._db.call("fetchrow", _GET_SESSION, session_id)
        return None if row is None else session_from_row(row)

    async def update_session(
        self,
        session_id: str,
        update: SessionUpdate,
        *,
        expected_status: SessionStatus | None = None,
    ) -> SessionRecord | None:
        """Apply ``update``; with ``expected_status``, as one compare-and-set UPDATE."""
        changes = {c: v for c, v in columns(update).items() if v is not None}
        args: list[Any] = [session_id, *changes.values(), time.time()]
        sets = [f"{c} = ${n}" for n, c in enumerate(changes, start=2)]
        sets.append(f"updated_at = ${len(args)}")
        # SessionUpdate.apply's rule, in SQL: every terminal status stamps finished_at.
        if update.status is not None and update.status.is_terminal:
            sets.append(f"finished_at = ${len(args)}")
        where = "session_id = $1"
        if expected_status is not None:
            args.append(expected_status.value)
            where += f" AND status = ${len(args)}"
        sql = f"UPDATE {{s}}.sessions SET {', '.join(sets)} WHERE {where} RETURNING *"
        row = await self._db.call("fetchrow", sql, *args)
        if row is not None:
            return session_from_row(row)
        # Gone (never created, or expired since): not found; else the status differed.
        if await self.get_session(session_id) is None:
            raise SessionNotFound(session_id)
        return None

    async def list_sessions(self, *, status: SessionStatus) -> list[SessionRecord]:
        """Sessions in ``status``, oldest first."""
        rows = await self._db.call("fetch", _LIST_SESSIONS, status.value)
        return [session_from_row(row) for row in rows]
