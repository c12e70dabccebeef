"""Listing one owner's sessions in the PostgreSQL store: the index and its query."""

from __future__ import annotations

from typing import Any

from helix_transport.store._listing import (
    UNOWNED_PRINCIPAL,
    SessionPage,
    SessionQuery,
    clamp,
    page_of,
)
from helix_transport.store._records import SessionRecord
from helix_transport.store.postgres._codec import session_from_row
from helix_transport.store.postgres._conn import Database

# The principal a record is listed under (a record from before owners is anonymous's);
# queries spell it exactly as the index does, so the planner uses the index. Ids
# compare by code point ("C"), as on every other backend, whatever the database's
# collation.
_OWNER = f"(CASE principal WHEN '' THEN '{UNOWNED_PRINCIPAL}' ELSE principal END)"
_ID = 'session_id COLLATE "C"'

MIGRATION = f"""
    CREATE INDEX sessions_by_owner ON {{s}}.sessions
        (tenant, {_OWNER}, created_at DESC, {_ID} DESC);
"""
"""Migration: the index ``query_sessions`` walks, newest first within an owner."""


def query_sql(query: SessionQuery, limit: int) -> tuple[str, list[Any]]:
    """The statement (``{s}`` for the schema) and its arguments: the first
    ``clamp(limit) + 1`` sessions ``query`` matches."""
    args: list[Any] = [query.tenant, query.principal]
    where = [f"tenant = $1 AND {_OWNER} = $2"]

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    if query.after is not None:
        where.append(f"(created_at, {_ID}) < ({arg(query.after[0])}, {arg(query.after[1])})")
    if query.statuses:
        where.append(f"status = ANY({arg(sorted(s.value for s in query.statuses))}::text[])")
    if query.agent_type:
        where.append(f"agent_type = {arg(query.agent_type)}")
    if query.created_after is not None:
        where.append(f"created_at >= {arg(query.created_after)}")
    if query.created_before is not None:
        where.append(f"created_at < {arg(query.created_before)}")
    if query.roots_only:
        where.append("parent_session_id = ''")
    sql = (
        f"SELECT * FROM {{s}}.sessions WHERE {' AND '.join(where)} "
        f"ORDER BY created_at DESC, {_ID} DESC LIMIT {arg(clamp(limit) + 1)}"
    )
    return sql, args


def _records(rows: list[Any]) -> list[SessionRecord]:
    """The rows ``query_sql`` selected, as records."""
    return [session_from_row(row) for row in rows]


class PostgresSessionIndex:
    """``SessionIndex`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def query_sessions(self, query: SessionQuery, *, limit: int) -> SessionPage:
        """The sessions ``query`` matches, newest first, from the owner index."""
        sql, args = query_sql(query, limit)
        rows = await self._db.call("fetch", sql, *args) if clamp(limit) else []
        return page_of(_records(rows), clamp(limit))
