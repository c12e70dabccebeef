"""People's answers in a PostgreSQL store: the ``answers`` table, keyed by session and
request id. "{s}" stands for the quoted schema, as in the store's own statements.
"""

from __future__ import annotations

from helix_transport.store._base import storable_answer
from helix_transport.store.postgres._conn import Database

MIGRATION = """
    -- text, not json: the store keeps an answer as the run wrote it (opaque to it).
    CREATE TABLE {s}.answers (session_id text NOT NULL, request_id text NOT NULL,
        answer text NOT NULL, PRIMARY KEY (session_id, request_id));
    ALTER TABLE {s}.interrupts ADD COLUMN abort boolean NOT NULL DEFAULT false;
"""
"""The migration that adds answers and aborts."""
# A concurrent insert of the same key makes this one wait for it to commit, then do
# nothing: a later statement (its own snapshot) then sees the stored answer. One
# statement could not: its snapshot predates the other's commit.
_INSERT_ANSWER = (
    "INSERT INTO {s}.answers (session_id, request_id, answer) VALUES ($1, $2, $3) "
    "ON CONFLICT (session_id, request_id) DO NOTHING RETURNING true"
)
_GET_ANSWER = "SELECT answer FROM {s}.answers WHERE session_id = $1 AND request_id = $2"
_LIST_ANSWERS = "SELECT request_id, answer FROM {s}.answers WHERE session_id = $1"


class PostgresInputs:
    """``InputStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put_answer(
        self, session_id: str, request_id: str, answer_json: str
    ) -> tuple[str, bool]:
        """Record the answer unless the request has one (see ``InputStore``)."""
        answer = storable_answer(request_id, answer_json)
        # Autocommit: each statement is its own transaction (see _INSERT_ANSWER).
        async with self._db.connection() as conn:
            while True:
                if await conn.fetchval(self._db.q(_INSERT_ANSWER), session_id, request_id, answer):
                    return answer, True
                stored: str | None = await conn.fetchval(
                    self._db.q(_GET_ANSWER), session_id, request_id
                )
                if stored is not None:
                    return stored, False
                # Retention removed the session's answers in between: the key is free again.

    async def list_answers(self, session_id: str) -> dict[str, str]:
        """The session's answers by request id."""
        rows = await self._db.call("fetch", _LIST_ANSWERS, session_id)
        return {row["request_id"]: row["answer"] for row in rows}
