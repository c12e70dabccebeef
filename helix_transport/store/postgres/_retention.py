"""Retention in a PostgreSQL store: its migration and statements.

"{s}" stands for the quoted schema.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from helix_transport.store._records import SessionRecord
from helix_transport.store._retention import Candidate, Tombstone, expirable
from helix_transport.store.postgres._codec import session_from_row
from helix_transport.store.postgres._conn import Database

MIGRATION = """
    -- Only finished sessions are indexed: running ones cost the index nothing.
    CREATE INDEX sessions_by_finished_at ON {s}.sessions (finished_at, session_id)
        WHERE status <> 'running';
    CREATE TABLE {s}.tombstones (session_id text PRIMARY KEY, expired_at float8 NOT NULL,
        kept_until float8 NOT NULL, principal text NOT NULL, tenant text NOT NULL);
    CREATE INDEX tombstones_by_kept_until ON {s}.tombstones (kept_until);
"""
"""The migration that adds retention."""

_FINISHED = (
    "SELECT * FROM {s}.sessions WHERE status <> 'running' AND status <> 'suspended' "
    "AND finished_at <= $1 "
    "AND (finished_at, session_id) > ($2, $3) ORDER BY finished_at, session_id LIMIT $4"
)
# The sessions and their roots, locked in one order (by id) so that two replicas'
# sweeps wait for each other instead of deadlocking; a Continue of either waits too.
_LOCK = (
    "SELECT * FROM {s}.sessions WHERE session_id = ANY($1::text[]) ORDER BY session_id FOR UPDATE"
)
# Everything keyed by the removed sessions; the refs and commands they hold as parents.
_REMOVE = (
    "DELETE FROM {s}.sessions WHERE session_id = ANY($1::text[])",
    "DELETE FROM {s}.events WHERE session_id = ANY($1::text[])",
    "DELETE FROM {s}.checkpoints WHERE session_id = ANY($1::text[])",
    "DELETE FROM {s}.interrupts WHERE session_id = ANY($1::text[])",
    "DELETE FROM {s}.answers WHERE session_id = ANY($1::text[])",
    "DELETE FROM {s}.subsession_refs WHERE parent_session_id = ANY($1::text[])",
    "DELETE FROM {s}.child_commands WHERE parent_session_id = ANY($1::text[])",
)
_TOMBSTONES = (
    "INSERT INTO {s}.tombstones SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], "
    "$4::text[], $5::text[]) ON CONFLICT (session_id) DO UPDATE SET "
    "expired_at = excluded.expired_at, kept_until = excluded.kept_until"
)
_GET_TOMBSTONE = "SELECT * FROM {s}.tombstones WHERE session_id = $1 AND kept_until > $2"
_DROP_TOMBSTONES = (
    "WITH old AS (SELECT session_id FROM {s}.tombstones WHERE kept_until <= $1 LIMIT $2) "
    "DELETE FROM {s}.tombstones t USING old WHERE t.session_id = old.session_id"
)


def _after_args(after: tuple[float, str] | None) -> tuple[float, str]:
    """``_FINISHED``'s cursor: before every session when ``after`` is None."""
    return after if after is not None else (float("-inf"), "")


async def _expire(
    conn: Any,
    q: Any,
    candidates: Sequence[Candidate],
    finished_before: float,
    keep_tombstone_s: float,
) -> list[str]:
    """Remove the candidates the rule allows, inside the caller's transaction on ``conn``
    (``q`` puts the schema into a statement)."""
    ids = {c.session_id for c in candidates} | {c.root_session_id for c in candidates}
    rows = await conn.fetch(q(_LOCK), sorted(ids))
    records: dict[str, SessionRecord] = {
        record.session_id: record for record in map(session_from_row, rows)
    }
    chosen = [
        records[c.session_id]
        for c in candidates
        if expirable(
            records.get(c.session_id),
            records.get(c.root_session_id),
            root_session_id=c.root_session_id,
            finished_before=finished_before,
        )
    ]
    if not chosen:
        return []
    removed = [record.session_id for record in chosen]
    for statement in _REMOVE:
        await conn.execute(q(statement), removed)
    now = time.time()
    await conn.execute(
        q(_TOMBSTONES),
        removed,
        [now] * len(removed),
        [now + keep_tombstone_s] * len(removed),
        [record.principal for record in chosen],
        [record.tenant for record in chosen],
    )
    return removed


def _tombstone(row: Any) -> Tombstone | None:
    """A ``tombstones`` row as a ``Tombstone``."""
    return None if row is None else Tombstone(**dict(row))


class PostgresRetention:
    """``RetentionStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def finished_sessions(
        self, *, finished_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[SessionRecord]:
        """Finished sessions ended by ``finished_before``, oldest end first (``RetentionStore``)."""
        args = (finished_before, *_after_args(after), max(limit, 0))
        return [session_from_row(r) for r in await self._db.call("fetch", _FINISHED, *args)]

    async def expire_sessions(
        self, candidates: Sequence[Candidate], *, finished_before: float, keep_tombstone_s: float
    ) -> list[str]:
        """Remove the candidates the rule still allows, in one transaction."""
        async with self._db.transaction() as conn:
            return await _expire(conn, self._db.q, candidates, finished_before, keep_tombstone_s)

    async def get_tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of an expired session, while it is kept."""
        row = await self._db.call("fetchrow", _GET_TOMBSTONE, session_id, time.time())
        return _tombstone(row)

    async def drop_tombstones(self, *, kept_until: float, limit: int) -> int:
        """Remove up to ``limit`` tombstones kept until ``kept_until`` or before."""
        status = await self._db.call("execute", _DROP_TOMBSTONES, kept_until, max(limit, 0))
        return int(status.rpartition(" ")[2])
