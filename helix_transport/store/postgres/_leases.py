"""Leases in a PostgreSQL store: the ``owner`` and ``lease_expires_at`` columns of
``sessions``, granted and checked against the database's clock."""

from __future__ import annotations

from collections.abc import Sequence

from helix_transport._exceptions import SessionNotFound
from helix_transport.store.postgres._codec import DB_NOW
from helix_transport.store.postgres._conn import Database

_RENEW_LEASES = f"""
    UPDATE {{s}}.sessions SET owner = $2, lease_expires_at = {DB_NOW} + $3
    WHERE session_id = ANY($1::text[])
    AND (owner = '' OR owner = $2 OR lease_expires_at <= {DB_NOW})
    RETURNING session_id
"""
# One statement: the CTE tells "no such session" apart from "held by someone else".
# A racing acquirer blocks on the row lock, then re-checks the WHERE on the new row.
_ACQUIRE_LEASE = f"""
    WITH target AS (SELECT 1 FROM {{s}}.sessions WHERE session_id = $1),
    taken AS (
        UPDATE {{s}}.sessions SET owner = $2, lease_expires_at = {DB_NOW} + $3
        WHERE session_id = $1 AND (owner = '' OR owner = $2 OR lease_expires_at <= {DB_NOW})
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM target) AS found, EXISTS (SELECT 1 FROM taken) AS taken
"""
_RELEASE_LEASE = (
    "UPDATE {s}.sessions SET owner = '', lease_expires_at = 0 WHERE session_id = $1 AND owner = $2"
)


class PostgresLeases:
    """``LeaseStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def acquire_lease(self, session_id: str, owner: str, *, ttl_s: float) -> bool:
        """Take or renew the lease if it is free, lapsed or already ``owner``'s.

        Expiry is set and checked with the database clock, so replicas whose
        clocks disagree still agree on who holds a lease.
        """
        row = await self._db.call("fetchrow", _ACQUIRE_LEASE, session_id, owner, ttl_s)
        if not row["found"]:
            raise SessionNotFound(session_id)
        return bool(row["taken"])

    async def renew_leases(
        self, session_ids: Sequence[str], owner: str, *, ttl_s: float
    ) -> set[str]:
        """``acquire_lease`` for every id, in one statement: the ids whose lease
        ``owner`` holds now (a missing session is not held)."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        rows = await self._db.call("fetch", _RENEW_LEASES, ids, owner, ttl_s)
        return {row["session_id"] for row in rows}

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        await self._db.call("execute", _RELEASE_LEASE, session_id, owner)
