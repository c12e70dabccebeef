"""A parent's refs to its children in a PostgreSQL store: ``subsession_refs``, in the
order they were first stored (``position``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.store._records import SubSessionRef
from helix_transport.store.postgres._codec import columns, upsert
from helix_transport.store.postgres._conn import Database

# The remote_stream_id and remote_last_sequence columns are no longer written (a cursor
# nothing read); rows written before keep them, and reading ignores them.
_REF_COLUMNS = [f.name for f in dataclasses.fields(SubSessionRef)]
# A replaced ref keeps its position: the position column is not among those replaced.
_PUT_REF = upsert(
    "subsession_refs", _REF_COLUMNS, ("parent_session_id", "child_session_id"), replace=True
)
_LIST_REFS = "SELECT * FROM {s}.subsession_refs WHERE parent_session_id = $1 ORDER BY position"
_GET_REF = (
    "SELECT * FROM {s}.subsession_refs WHERE parent_session_id = $1 AND child_session_id = $2"
)


class PostgresChildRefs:
    """``ChildRefStore`` on ``db``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        """Insert or replace the ref keyed by (parent, child session id)."""
        values = columns(ref)
        await self._db.call("execute", _PUT_REF, *(values[c] for c in _REF_COLUMNS))

    async def list_subsession_refs(self, parent_session_id: str) -> list[SubSessionRef]:
        """The parent's refs, in the order they were first stored."""
        rows = await self._db.call("fetch", _LIST_REFS, parent_session_id)
        return [_ref_from_row(row) for row in rows]

    async def get_subsession_ref(
        self, parent_session_id: str, child_session_id: str
    ) -> SubSessionRef | None:
        """The ref keyed by (parent, child session id), or ``None``."""
        row = await self._db.call("fetchrow", _GET_REF, parent_session_id, child_session_id)
        return None if row is None else _ref_from_row(row)


def _ref_from_row(row: Any) -> SubSessionRef:
    fields = {name: row[name] for name in _REF_COLUMNS}
    return SubSessionRef(**fields | {"status": SessionStatus(row["status"])})
