"""Refs from a parent session to its children in an SQLite store."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.store._records import SubSessionRef

# The remote_stream_id and remote_last_sequence columns are no longer written (a cursor
# nothing read); rows written before keep them, and reading ignores them.
_REF_COLUMNS = [f.name for f in dataclasses.fields(SubSessionRef)]
# A new ref goes after the parent's others; a replaced one keeps its position.
PUT_REF = (
    f"INSERT INTO subsession_refs (position, {', '.join(_REF_COLUMNS)}) VALUES ("
    "(SELECT COALESCE(MAX(position), 0) + 1 FROM subsession_refs"
    " WHERE parent_session_id = :parent_session_id), "
    f"{', '.join(':' + c for c in _REF_COLUMNS)}) "
    "ON CONFLICT (parent_session_id, child_session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _REF_COLUMNS if not c.endswith("session_id"))
)


def ref_params(ref: SubSessionRef) -> dict[str, Any]:
    params = {f.name: getattr(ref, f.name) for f in dataclasses.fields(ref)}
    params["status"] = ref.status.value
    return params


def ref_from_row(row: sqlite3.Row) -> SubSessionRef:
    fields = {name: row[name] for name in _REF_COLUMNS}
    fields["status"] = SessionStatus(row["status"])
    return SubSessionRef(**fields)
