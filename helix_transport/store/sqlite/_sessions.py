"""Session records, leases and pending interrupts in an SQLite store."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import SessionNotFound
from helix_transport.store._records import (
    SessionRecord,
    SessionUpdate,
    Usage,
)
from helix_transport.store.sqlite._conn import transaction

# Derived from the records so a new field without a schema migration fails loudly
# ("no column named ...") instead of being dropped silently.
_SESSION_COLUMNS = [f.name for f in dataclasses.fields(SessionRecord)]
# What update_session/append may change; leases are written only by the lease methods.
_STATE_COLUMNS = [
    *(f.name for f in dataclasses.fields(SessionUpdate)),
    "last_sequence",
    "updated_at",
    "finished_at",
]

_INSERT_SESSION = (
    f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _SESSION_COLUMNS)}) "
    "ON CONFLICT (session_id) DO NOTHING"
)
WRITE_STATE = (
    f"UPDATE sessions SET {', '.join(f'{c} = :{c}' for c in _STATE_COLUMNS)} "
    "WHERE session_id = :session_id"
)
_ACQUIRE_LEASE = (
    "UPDATE sessions SET owner = :owner, lease_expires_at = :expires "
    "WHERE session_id = :session_id "
    "AND (owner = '' OR owner = :owner OR lease_expires_at <= :now)"
)


def get_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    row = conn.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else session_from_row(row)


def require_session(conn: sqlite3.Connection, session_id: str) -> SessionRecord:
    record = get_session(conn, session_id)
    if record is None:
        raise SessionNotFound(session_id)
    return record


def create_session(
    conn: sqlite3.Connection, record: SessionRecord, lease_ttl_s: float | None
) -> tuple[SessionRecord, bool]:
    if lease_ttl_s is not None:  # the clock acquire_lease judges by: this process's
        record = dataclasses.replace(record, lease_expires_at=time.time() + lease_ttl_s)
    with transaction(conn):
        created = conn.execute(_INSERT_SESSION, session_params(record)).rowcount == 1
        return require_session(conn, record.session_id), created


def update_session(
    conn: sqlite3.Connection,
    session_id: str,
    update: SessionUpdate,
    expected_status: SessionStatus | None,
) -> SessionRecord | None:
    with transaction(conn):
        record = require_session(conn, session_id)
        if expected_status is not None and record.status != expected_status:
            return None
        record = update.apply(record, now=time.time())
        conn.execute(WRITE_STATE, session_params(record))
        return record


def acquire_lease(conn: sqlite3.Connection, session_id: str, owner: str, ttl_s: float) -> bool:
    with transaction(conn):
        now = time.time()
        params = {"session_id": session_id, "owner": owner, "now": now, "expires": now + ttl_s}
        if conn.execute(_ACQUIRE_LEASE, params).rowcount == 1:
            return True
        require_session(conn, session_id)
        return False


def pending_interrupts(conn: sqlite3.Connection, ids: list[str]) -> set[str]:
    room = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    pending: set[str] = set()
    for start in range(0, len(ids), room):
        part = ids[start : start + room]
        marks = ", ".join("?" * len(part))
        sql = f"SELECT session_id FROM interrupts WHERE session_id IN ({marks})"
        pending.update(row[0] for row in conn.execute(sql, part))
    return pending


def renew_leases(conn: sqlite3.Connection, ids: list[str], owner: str, ttl_s: float) -> set[str]:
    # Set-based, as appends are: a statement per session made 500 sessions' renewal
    # 500 transactions, each waiting on the busy loop for the GIL.
    room = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 4
    parts = [ids[start : start + room] for start in range(0, len(ids), room)]
    with transaction(conn):
        now = time.time()
        expires = now + ttl_s
        taken = 0
        for part in parts:
            marks = ", ".join("?" * len(part))
            sql = (
                "UPDATE sessions SET owner = ?, lease_expires_at = ? "
                f"WHERE session_id IN ({marks}) "
                "AND (owner = '' OR owner = ? OR lease_expires_at <= ?)"
            )
            taken += conn.execute(sql, (owner, expires, *part, owner, now)).rowcount
        if taken == len(ids):
            return set(ids)
        held: set[str] = set()
        for part in parts:  # which ones: one row per statement, not one per session
            marks = ", ".join("?" * len(part))
            sql = (
                "SELECT group_concat(session_id, char(31)) FROM sessions "
                f"WHERE session_id IN ({marks}) AND owner = ? AND lease_expires_at = ?"
            )
            (joined,) = conn.execute(sql, (*part, owner, expires)).fetchone()
            held.update(joined.split("\x1f") if joined else ())
        return held


def session_params(record: SessionRecord) -> dict[str, Any]:
    params = {name: getattr(record, name) for name in _SESSION_COLUMNS}
    params["status"] = record.status.value
    params["metadata"] = json.dumps(record.metadata)
    params["usage"] = json.dumps(dataclasses.asdict(record.usage))
    return params


def session_from_row(row: sqlite3.Row) -> SessionRecord:
    fields = {name: row[name] for name in _SESSION_COLUMNS}
    fields["status"] = SessionStatus(row["status"])
    fields["metadata"] = json.loads(row["metadata"])
    fields["usage"] = Usage(**json.loads(row["usage"]))
    return SessionRecord(**fields)
