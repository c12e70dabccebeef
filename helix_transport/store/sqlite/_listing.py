"""Listing one owner's sessions in an SQLite store: the index and its query."""

from __future__ import annotations

import sqlite3
from typing import Any

from helix_transport.store._listing import (
    UNOWNED_PRINCIPAL,
    SessionPage,
    SessionQuery,
    clamp,
    page_of,
)
from helix_transport.store.sqlite._sessions import session_from_row

# The principal a record is listed under: a record from before owners is anonymous's.
# A query must spell the expression exactly so for SQLite to use the index.
_OWNER = f"(CASE principal WHEN '' THEN '{UNOWNED_PRINCIPAL}' ELSE principal END)"

UPGRADE = (
    f"CREATE INDEX IF NOT EXISTS sessions_by_owner ON sessions "
    f"(tenant, {_OWNER}, created_at DESC, session_id DESC)",
)
"""Schema upgrade: the index ``query_sessions`` walks, newest first within an owner."""


def query_sessions(conn: sqlite3.Connection, query: SessionQuery, limit: int) -> SessionPage:
    """Up to ``limit`` sessions ``query`` matches, from ``sessions_by_owner``."""
    limit = clamp(limit)
    if limit == 0:
        return SessionPage(records=[], next_after=None)
    where = [f"tenant = ? AND {_OWNER} = ?"]
    params: list[Any] = [query.tenant, query.principal]
    if query.after is not None:
        where.append("(created_at, session_id) < (?, ?)")
        params += query.after
    if query.statuses:
        where.append(f"status IN ({', '.join('?' * len(query.statuses))})")
        params += sorted(status.value for status in query.statuses)
    if query.agent_type:
        where.append("agent_type = ?")
        params.append(query.agent_type)
    if query.created_after is not None:
        where.append("created_at >= ?")
        params.append(query.created_after)
    if query.created_before is not None:
        where.append("created_at < ?")
        params.append(query.created_before)
    if query.roots_only:
        where.append("parent_session_id = ''")
    sql = (
        f"SELECT * FROM sessions WHERE {' AND '.join(where)} "
        "ORDER BY created_at DESC, session_id DESC LIMIT ?"
    )
    rows = conn.execute(sql, (*params, limit + 1)).fetchall()
    return page_of([session_from_row(row) for row in rows], limit)
