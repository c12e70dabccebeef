"""People's input in a PostgreSQL store: interrupt requests (with abort) and answers.

"{s}" stands for the quoted schema, as in the store's own statements.
"""

from __future__ import annotations

from typing import Any

from helix_transport.store._records import Interrupt

MIGRATION = """
    -- text, not json: the store keeps an answer as the run wrote it (opaque to it).
    CREATE TABLE {s}.answers (session_id text NOT NULL, request_id text NOT NULL,
        answer text NOT NULL, PRIMARY KEY (session_id, request_id));
    ALTER TABLE {s}.interrupts ADD COLUMN abort boolean NOT NULL DEFAULT false;
"""
"""The migration that adds answers and aborts."""

# A plain interrupt does not replace a pending abort (the WHERE leaves the row as is).
SET_INTERRUPT = (
    "INSERT INTO {s}.interrupts AS i (session_id, reason, abort) VALUES ($1, $2, $3) "
    "ON CONFLICT (session_id) DO UPDATE SET reason = EXCLUDED.reason, abort = EXCLUDED.abort "
    "WHERE EXCLUDED.abort OR NOT i.abort"
)
TAKE_INTERRUPT = "DELETE FROM {s}.interrupts WHERE session_id = $1 RETURNING reason, abort"
# A concurrent insert of the same key makes this one wait for it to commit, then do
# nothing: a later statement (its own snapshot) then sees the stored answer. One
# statement could not: its snapshot predates the other's commit.
INSERT_ANSWER = (
    "INSERT INTO {s}.answers (session_id, request_id, answer) VALUES ($1, $2, $3) "
    "ON CONFLICT (session_id, request_id) DO NOTHING RETURNING true"
)
GET_ANSWER = "SELECT answer FROM {s}.answers WHERE session_id = $1 AND request_id = $2"
LIST_ANSWERS = "SELECT request_id, answer FROM {s}.answers WHERE session_id = $1"


def interrupt(row: Any) -> Interrupt | None:
    """A ``TAKE_INTERRUPT`` row as an ``Interrupt``."""
    return None if row is None else Interrupt(row["reason"], abort=row["abort"])


async def put_answer(
    conn: Any, q: Any, session_id: str, request_id: str, answer: str
) -> tuple[str, bool]:
    """Insert the answer unless the request has one, on ``conn`` (autocommit: each
    statement its own transaction; ``q`` puts the schema into a statement)."""
    while True:
        if await conn.fetchval(q(INSERT_ANSWER), session_id, request_id, answer):
            return answer, True
        stored: str | None = await conn.fetchval(q(GET_ANSWER), session_id, request_id)
        if stored is not None:
            return stored, False
        # Retention removed the session's answers in between: the key is free again.
