"""Checkpoints in a PostgreSQL store: the ``checkpoints`` table, one row a session."""

from __future__ import annotations

import dataclasses
import json

from helix_transport._exceptions import SequenceConflict
from helix_transport.store._records import Checkpoint, Usage
from helix_transport.store.postgres._codec import columns, upsert
from helix_transport.store.postgres._conn import Database

CHECKPOINT_COLUMNS = [f.name for f in dataclasses.fields(Checkpoint)]
"""The table's columns, the record's fields (an append may write a checkpoint too)."""
CHECKPOINT_TYPES = {
    "session_id": "text",
    "step": "integer",
    "messages": "json",
    "usage": "jsonb",
    "last_sequence": "bigint",
    "state": "json",
}
"""Each column's type, for statements that pass the values as typed parameters."""
_SAVE_CHECKPOINT = upsert("checkpoints", CHECKPOINT_COLUMNS, ("session_id",), replace=True)
_LOAD_CHECKPOINT = "SELECT * FROM {s}.checkpoints WHERE session_id = $1"


class PostgresCheckpoints:
    """``CheckpointStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the session's checkpoint, fenced by the log's end (see ``Store``)."""
        async with self._db.transaction() as conn:
            last = await conn.fetchval(
                self._db.q(
                    "SELECT last_sequence FROM {s}.sessions WHERE session_id = $1 FOR SHARE"
                ),
                checkpoint.session_id,
            )
            if last is not None and last != checkpoint.last_sequence:
                raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, last)
            await conn.execute(self._db.q(_SAVE_CHECKPOINT), *columns(checkpoint).values())

    async def load_checkpoint(self, session_id: str) -> Checkpoint | None:
        """The session's latest checkpoint, or ``None``."""
        row = await self._db.call("fetchrow", _LOAD_CHECKPOINT, session_id)
        if row is None:
            return None
        fields = dict(row.items())
        for name in ("messages", "usage", "state"):
            fields[name] = json.loads(fields[name])
        fields["usage"] = Usage(**fields["usage"])
        return Checkpoint(**fields)
