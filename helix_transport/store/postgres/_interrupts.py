"""Interrupt requests (with abort) in a PostgreSQL store: the ``interrupts`` table,
one row a session while a request is untaken."""

from __future__ import annotations

from collections.abc import Sequence

from helix_transport.store._records import Interrupt, storable_text
from helix_transport.store.postgres._conn import Database

# A plain interrupt does not replace a pending abort (the WHERE leaves the row as is).
_SET_INTERRUPT = (
    "INSERT INTO {s}.interrupts AS i (session_id, reason, abort) VALUES ($1, $2, $3) "
    "ON CONFLICT (session_id) DO UPDATE SET reason = EXCLUDED.reason, abort = EXCLUDED.abort "
    "WHERE EXCLUDED.abort OR NOT i.abort"
)
_TAKE_INTERRUPT = "DELETE FROM {s}.interrupts WHERE session_id = $1 RETURNING reason, abort"
_PENDING_INTERRUPTS = "SELECT session_id FROM {s}.interrupts WHERE session_id = ANY($1::text[])"


class PostgresInterrupts:
    """``InterruptStore`` and ``InterruptLookup`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def set_interrupt(self, session_id: str, reason: str, *, abort: bool = False) -> None:
        """Record an interrupt request; a later one replaces an untaken one, but a plain
        interrupt never replaces an abort."""
        text = storable_text(reason)
        await self._db.call("execute", _SET_INTERRUPT, session_id, text, bool(abort))

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        """Read and clear the session's interrupt request in one statement."""
        row = await self._db.call("fetchrow", _TAKE_INTERRUPT, session_id)
        return None if row is None else Interrupt(row["reason"], abort=row["abort"])

    async def pending_interrupts(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` with an untaken interrupt request."""
        ids = list(dict.fromkeys(session_ids))
        if not ids:
            return set()
        rows = await self._db.call("fetch", _PENDING_INTERRUPTS, ids)
        return {row["session_id"] for row in rows}
