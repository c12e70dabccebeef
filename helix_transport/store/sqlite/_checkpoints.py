"""Checkpoints in an SQLite store."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

from helix_transport._exceptions import SequenceConflict
from helix_transport.store._records import (
    Checkpoint,
    Usage,
)
from helix_transport.store.sqlite._conn import transaction


def save_checkpoint(conn: sqlite3.Connection, checkpoint: Checkpoint) -> None:
    with transaction(conn):
        row = conn.execute(
            "SELECT last_sequence FROM sessions WHERE session_id = ?", (checkpoint.session_id,)
        ).fetchone()
        if row is not None and row[0] != checkpoint.last_sequence:
            raise SequenceConflict(checkpoint.session_id, checkpoint.last_sequence, row[0])
        write_checkpoint(conn, checkpoint_params(checkpoint))


CheckpointParams = tuple[str, int, str, str, int, str]
"""A checkpoint as the row that stores it."""


def checkpoint_params(checkpoint: Checkpoint) -> CheckpointParams:
    """The checkpoint's row; raises (``TypeError``) when it is not JSON."""
    return (
        checkpoint.session_id,
        checkpoint.step,
        json.dumps(checkpoint.messages),
        json.dumps(dataclasses.asdict(checkpoint.usage)),
        checkpoint.last_sequence,
        json.dumps(checkpoint.state),
    )


def write_checkpoint(conn: sqlite3.Connection, params: CheckpointParams | None) -> None:
    """Replace the session's checkpoint, inside the caller's transaction."""
    if params is not None:
        conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?)", params)


def load_checkpoint(conn: sqlite3.Connection, session_id: str) -> Checkpoint | None:
    sql = "SELECT * FROM checkpoints WHERE session_id = ?"
    row = conn.execute(sql, (session_id,)).fetchone()
    if row is None:
        return None
    fields = dict(zip(row.keys(), row, strict=True))
    for name in ("messages", "state"):
        fields[name] = json.loads(fields[name])
    fields["usage"] = Usage(**json.loads(fields["usage"]))
    return Checkpoint(**fields)
