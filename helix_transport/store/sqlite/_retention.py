"""Retention in an SQLite store: finished sessions by their end, their removal, tombstones.

The functions run on the store's worker thread; a removal is one write transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from helix_transport.store._records import SessionRecord
from helix_transport.store._retention import Candidate, Tombstone, expirable
from helix_transport.store.sqlite._conn import transaction
from helix_transport.store.sqlite._sessions import get_session, session_from_row

UPGRADE: tuple[str, ...] = (
    # Only finished sessions are indexed: running ones cost the index nothing.
    "CREATE INDEX sessions_by_finished_at ON sessions (finished_at, session_id) "
    "WHERE status <> 'running'",
    "CREATE TABLE tombstones (session_id TEXT PRIMARY KEY, expired_at REAL NOT NULL, "
    "kept_until REAL NOT NULL, principal TEXT NOT NULL, tenant TEXT NOT NULL)",
    "CREATE INDEX tombstones_by_kept_until ON tombstones (kept_until)",
)
"""The schema upgrade that adds retention."""

_FINISHED = (
    "SELECT * FROM sessions WHERE status <> 'running' AND status <> 'suspended' "
    "AND finished_at <= ? "
    "AND (finished_at > ? OR (finished_at = ? AND session_id > ?)) "
    "ORDER BY finished_at, session_id LIMIT ?"
)
# Everything keyed by the session; the refs and commands it holds as a parent.
_REMOVE = (
    "DELETE FROM sessions WHERE session_id = ?",
    "DELETE FROM events WHERE session_id = ?",
    "DELETE FROM checkpoints WHERE session_id = ?",
    "DELETE FROM interrupts WHERE session_id = ?",
    "DELETE FROM answers WHERE session_id = ?",
    "DELETE FROM subsession_refs WHERE parent_session_id = ?",
    "DELETE FROM child_commands WHERE parent_session_id = ?",
)
_TOMBSTONE = "INSERT OR REPLACE INTO tombstones VALUES (?, ?, ?, ?, ?)"


def finished_sessions(
    conn: sqlite3.Connection,
    finished_before: float,
    after: tuple[float, str] | None,
    limit: int,
) -> list[SessionRecord]:
    """Finished sessions ended by ``finished_before``, by (finished_at, session_id)."""
    at, session_id = after if after is not None else (float("-inf"), "")
    params = (finished_before, at, at, session_id, max(limit, 0))
    return [session_from_row(row) for row in conn.execute(_FINISHED, params)]


def expire(
    conn: sqlite3.Connection,
    candidates: Sequence[Candidate],
    finished_before: float,
    keep_tombstone_s: float,
) -> list[str]:
    """Remove the candidates the rule allows, in one transaction: all checked and removed
    under SQLite's write lock, so no Continue slips in between."""
    removed, now = [], time.time()
    with transaction(conn):
        for each in candidates:
            record = get_session(conn, each.session_id)
            root = get_session(conn, each.root_session_id)
            if record is None or not expirable(
                record, root, root_session_id=each.root_session_id, finished_before=finished_before
            ):
                continue
            for statement in _REMOVE:
                conn.execute(statement, (each.session_id,))
            tombstone = (each.session_id, now, now + keep_tombstone_s, record.principal)
            conn.execute(_TOMBSTONE, (*tombstone, record.tenant))
            removed.append(each.session_id)
    return removed


def get_tombstone(conn: sqlite3.Connection, session_id: str) -> Tombstone | None:
    """The session's tombstone while it is kept."""
    row = conn.execute(
        "SELECT * FROM tombstones WHERE session_id = ? AND kept_until > ?",
        (session_id, time.time()),
    ).fetchone()
    return None if row is None else Tombstone(**dict(row))


def drop_tombstones(conn: sqlite3.Connection, kept_until: float, limit: int) -> int:
    """Remove up to ``limit`` tombstones past ``kept_until``; how many."""
    sql = (
        "DELETE FROM tombstones WHERE session_id IN (SELECT session_id FROM tombstones "
        "WHERE kept_until <= ? LIMIT ?)"
    )
    with transaction(conn):
        return conn.execute(sql, (kept_until, max(limit, 0))).rowcount
