"""The event log in a PostgreSQL store: the ``events`` table, and each session's
``last_sequence``, which fences appends."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from helix_transport._exceptions import SequenceConflict, SessionNotFound
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._base import (
    READ_LIMIT,
    appended_count,
    check_checkpoint,
    check_page,
    given_bytes,
)
from helix_transport.store._records import Checkpoint, SessionUpdate
from helix_transport.store.postgres._checkpoints import CHECKPOINT_COLUMNS, CHECKPOINT_TYPES
from helix_transport.store.postgres._codec import columns
from helix_transport.store.postgres._conn import Database

_LAST_SEQUENCE = "SELECT last_sequence FROM {s}.sessions WHERE session_id = $1"
_READ = (
    "SELECT data FROM {s}.events WHERE session_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
)
# The page in one row of two arrays (asyncpg decodes each in C), not a row per event.
_READ_ENCODED = (
    "SELECT array_agg(sequence ORDER BY sequence), array_agg(data ORDER BY sequence) FROM ("
    " SELECT sequence, data FROM {s}.events WHERE session_id = $1 AND sequence > $2"
    " ORDER BY sequence LIMIT $3) AS page"
)
# Fields a SessionUpdate sets (NULL: left as is), then the two times it stamps.
_UPDATED_COLUMNS = [f.name for f in dataclasses.fields(SessionUpdate)]
_UPDATED_COLUMNS += ["updated_at", "finished_at"]


def _fenced_append(*, checkpoint: bool) -> str:
    """A fenced append as one statement, so one round trip and its own transaction (the
    transaction path takes six: BEGIN, a locking read, the inserts, the update, COMMIT).

    $1 session, $2 the expected end of the log, $3 the events' bytes, then the update's
    columns and, with ``checkpoint``, the checkpoint's; the last parameter is the
    ``NOTIFY`` channel. The ``UPDATE`` is the fence: under READ COMMITTED a concurrent
    append makes it wait, then re-check ``last_sequence`` on the row that append left,
    and match nothing. No row back: a conflict, or no such session.
    """
    n = 4 + len(_UPDATED_COLUMNS)
    sets = ", ".join(f"{c} = COALESCE(${i}, {c})" for i, c in enumerate(_UPDATED_COLUMNS, 4))
    sql = (
        "WITH moved AS (UPDATE {s}.sessions SET last_sequence = $2 + cardinality($3::bytea[]), "
        f"{sets} WHERE session_id = $1 AND last_sequence = $2 RETURNING last_sequence), "
        "stored AS (INSERT INTO {s}.events (session_id, sequence, data) "
        "SELECT $1, $2 + e.n, e.data FROM moved, unnest($3::bytea[]) WITH ORDINALITY AS e(data, n))"
    )
    if checkpoint:
        columns = CHECKPOINT_COLUMNS
        values = ", ".join(f"${i}::{CHECKPOINT_TYPES[c]}" for i, c in enumerate(columns, n))
        rest = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != "session_id")
        sql += (
            f", saved AS (INSERT INTO {{s}}.checkpoints ({', '.join(columns)}) "
            f"SELECT {values} FROM moved ON CONFLICT (session_id) DO UPDATE SET {rest})"
        )
        n += len(columns)
    # Delivered on commit only, so listeners never hear of an append that failed.
    return sql + (
        " SELECT last_sequence, CASE WHEN cardinality($3::bytea[]) > 0 "
        f"THEN pg_notify(${n}::text, $1) END FROM moved"
    )


_APPEND_FENCED = _fenced_append(checkpoint=False)
_APPEND_FENCED_CHECKPOINT = _fenced_append(checkpoint=True)


class PostgresEventLog:
    """``EventLogStore`` on ``db``; every append with events notifies ``channel``."""

    def __init__(self, db: Database, channel: str) -> None:
        self._db = db
        self._channel = channel

    async def append(
        self,
        session_id: str,
        events: Sequence[StreamEvent],
        *,
        expected_sequence: int,
        update: SessionUpdate | None = None,
        encoded: Sequence[bytes] | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> int:
        """Append ``events``, assigning their sequences in place (see ``Store.append``).

        One statement (``_fenced_append``). When the append fails, the events keep
        their previous sequences.
        """
        given = given_bytes(events, encoded)
        check_checkpoint(session_id, checkpoint, expected_sequence, appended_count(events, given))
        previous = [event.sequence for event in events]
        try:
            for sequence, event in enumerate(events, expected_sequence + 1):
                event.sequence = sequence
            data = given if given is not None else [e.SerializeToString() for e in events]
            return await self._append_fenced(
                session_id, expected_sequence, data, update=update, checkpoint=checkpoint
            )
        except BaseException:
            # Nothing was stored, so the caller's events must not claim sequences either.
            for event, sequence in zip(events, previous, strict=True):
                event.sequence = sequence
            raise

    async def _append_fenced(
        self,
        session_id: str,
        expected_sequence: int,
        data: Sequence[bytes],
        *,
        update: SessionUpdate | None,
        checkpoint: Checkpoint | None,
    ) -> int:
        """A fenced append of ``data`` (the events' bytes, numbered from
        ``expected_sequence + 1``) in one statement: see ``_fenced_append``."""
        changes: list[Any] = [None] * len(_UPDATED_COLUMNS)
        if update is not None:
            now = time.time()
            record = columns(update) | {"updated_at": now, "finished_at": None}
            if update.status is not None and update.status.is_terminal:
                record["finished_at"] = now  # as SessionUpdate.apply stamps it
            changes = [record[c] for c in _UPDATED_COLUMNS]
        args: list[Any] = [session_id, expected_sequence, list(data), *changes]
        if checkpoint is not None:
            args += columns(checkpoint).values()
        args.append(self._channel)
        template = _APPEND_FENCED if checkpoint is None else _APPEND_FENCED_CHECKPOINT
        row = await self._db.call("fetchrow", template, *args)
        if row is not None:
            return int(row["last_sequence"])
        last = await self._db.call("fetchval", _LAST_SEQUENCE, session_id)
        if last is None:
            raise SessionNotFound(session_id)
        raise SequenceConflict(session_id, expected_sequence, last)

    async def read(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[StreamEvent]:
        """Up to ``limit`` (at most ``READ_LIMIT``) events after ``from_sequence``."""
        limit = max(min(limit, READ_LIMIT), 0)
        rows = await self._db.call("fetch", _READ, session_id, from_sequence, limit)
        return [StreamEvent.FromString(row["data"]) for row in rows]

    async def read_encoded(
        self, session_id: str, *, from_sequence: int = 0, limit: int = READ_LIMIT
    ) -> list[bytes]:
        """``read``'s page as the bytes stored (see ``EncodedEventReader``).

        Raises:
            StoreError: the log there is not the events right after ``from_sequence``.
        """
        limit = max(min(limit, READ_LIMIT), 0)
        sequences, data = await self._db.call(
            "fetchrow", _READ_ENCODED, session_id, from_sequence, limit
        )
        if not data:
            return []
        check_page(session_id, from_sequence, sequences)
        encoded: list[bytes] = data
        return encoded
