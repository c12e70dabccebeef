"""People's input in an SQLite store: interrupt requests (with abort) and answers.

The functions run on the store's worker thread, each a write transaction of its own
where it writes.
"""

from __future__ import annotations

import sqlite3

from helix_transport.store._records import Interrupt
from helix_transport.store.sqlite._conn import transaction

UPGRADE: tuple[str, ...] = (
    # An answer can be a client tool's result of a MiB or so: a rowid table, whose rows
    # may overflow into pages of their own, where WITHOUT ROWID wants small rows.
    "CREATE TABLE answers (session_id TEXT NOT NULL, request_id TEXT NOT NULL, "
    "answer TEXT NOT NULL, PRIMARY KEY (session_id, request_id))",
    "ALTER TABLE interrupts ADD COLUMN abort INTEGER NOT NULL DEFAULT 0",
)
"""The schema upgrade that adds answers and aborts."""

# A plain interrupt does not replace a pending abort (the WHERE leaves the row as is).
_SET_INTERRUPT = (
    "INSERT INTO interrupts (session_id, reason, abort) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET reason = excluded.reason, abort = excluded.abort "
    "WHERE excluded.abort OR NOT interrupts.abort"
)
_PUT_ANSWER = (
    "INSERT INTO answers (session_id, request_id, answer) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id, request_id) DO NOTHING"
)
_GET_ANSWER = "SELECT answer FROM answers WHERE session_id = ? AND request_id = ?"
_LIST_ANSWERS = "SELECT request_id, answer FROM answers WHERE session_id = ?"


def set_interrupt(conn: sqlite3.Connection, session_id: str, reason: str, abort: bool) -> None:
    """Record the request (see ``InterruptStore.set_interrupt``)."""
    with transaction(conn):
        conn.execute(_SET_INTERRUPT, (session_id, reason, int(abort)))


def take_interrupt(conn: sqlite3.Connection, session_id: str) -> Interrupt | None:
    """Read and clear the session's request, in one transaction."""
    with transaction(conn):
        sql = "SELECT reason, abort FROM interrupts WHERE session_id = ?"
        row = conn.execute(sql, (session_id,)).fetchone()
        if row is None:
            return None
        conn.execute("DELETE FROM interrupts WHERE session_id = ?", (session_id,))
        return Interrupt(row["reason"], abort=bool(row["abort"]))


def put_answer(
    conn: sqlite3.Connection, session_id: str, request_id: str, answer: str
) -> tuple[str, bool]:
    """Insert the answer unless the request has one, under the write lock: (stored, by us)."""
    with transaction(conn):
        if conn.execute(_PUT_ANSWER, (session_id, request_id, answer)).rowcount == 1:
            return answer, True
        stored: str = conn.execute(_GET_ANSWER, (session_id, request_id)).fetchone()[0]
        return stored, False


def list_answers(conn: sqlite3.Connection, session_id: str) -> dict[str, str]:
    """The session's answers by request id."""
    return {row[0]: row[1] for row in conn.execute(_LIST_ANSWERS, (session_id,))}
