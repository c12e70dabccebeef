"""The PostgreSQL store's statements (``{s}`` stands for the quoted schema) and row conversions."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.store._records import (
    Checkpoint,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
)

# Derived from the records so a new field without a migration fails loudly
# ("column ... does not exist") instead of being dropped silently.
_SESSION_COLUMNS = [f.name for f in dataclasses.fields(SessionRecord)]
# What append may change; leases are written only by the lease methods.
_STATE_COLUMNS = [f.name for f in dataclasses.fields(SessionUpdate)]
_STATE_COLUMNS += ["last_sequence", "updated_at", "finished_at"]
# The remote_stream_id and remote_last_sequence columns are no longer written (a cursor
# nothing read); rows written before keep them, and reading ignores them.
_REF_COLUMNS = [f.name for f in dataclasses.fields(SubSessionRef)]


def _upsert(table: str, columns: list[str], keys: tuple[str, ...], *, replace: bool) -> str:
    """An INSERT of ``columns`` that, when ``keys`` exist, replaces the rest or does nothing."""
    values = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
    rest = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in keys)
    action = f"DO UPDATE SET {rest}" if replace else "DO NOTHING RETURNING *"
    return (
        f"INSERT INTO {{s}}.{table} ({', '.join(columns)}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(keys)}) {action}"
    )


_INSERT_SESSION = _upsert("sessions", _SESSION_COLUMNS, ("session_id",), replace=False)
# A replaced ref keeps its position: the position column is not among those replaced.
_PUT_REF = _upsert(
    "subsession_refs", _REF_COLUMNS, ("parent_session_id", "child_session_id"), replace=True
)
_GET_SESSION = "SELECT * FROM {s}.sessions WHERE session_id = $1"
_LAST_SEQUENCE = "SELECT last_sequence FROM {s}.sessions WHERE session_id = $1"
_LIST_SESSIONS = "SELECT * FROM {s}.sessions WHERE status = $1 ORDER BY created_at, session_id"
_READ = (
    "SELECT data FROM {s}.events WHERE session_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
)
_CHECKPOINT_COLUMNS = [f.name for f in dataclasses.fields(Checkpoint)]
_SAVE_CHECKPOINT = _upsert("checkpoints", _CHECKPOINT_COLUMNS, ("session_id",), replace=True)
_LOAD_CHECKPOINT = "SELECT * FROM {s}.checkpoints WHERE session_id = $1"
# Fields a SessionUpdate sets (NULL: left as is), then the two times it stamps.
_UPDATED_COLUMNS = [c for c in _STATE_COLUMNS if c != "last_sequence"]
_CHECKPOINT_TYPES = {
    "session_id": "text",
    "step": "integer",
    "messages": "json",
    "usage": "jsonb",
    "last_sequence": "bigint",
    "state": "json",
}


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
        columns = _CHECKPOINT_COLUMNS
        values = ", ".join(f"${i}::{_CHECKPOINT_TYPES[c]}" for i, c in enumerate(columns, n))
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
_PENDING_INTERRUPTS = "SELECT session_id FROM {s}.interrupts WHERE session_id = ANY($1::text[])"
_LIST_REFS = "SELECT * FROM {s}.subsession_refs WHERE parent_session_id = $1 ORDER BY position"
_GET_REF = (
    "SELECT * FROM {s}.subsession_refs WHERE parent_session_id = $1 AND child_session_id = $2"
)
_RELEASE_LEASE = (
    "UPDATE {s}.sessions SET owner = '', lease_expires_at = 0 WHERE session_id = $1 AND owner = $2"
)
_DB_NOW = "extract(epoch FROM clock_timestamp())::double precision"
# _INSERT_SESSION, leased: the lease_expires_at parameter is the TTL, added to the
# database's clock (as _ACQUIRE_LEASE does).
_INSERT_SESSION_LEASED = (
    f"INSERT INTO {{s}}.sessions ({', '.join(_SESSION_COLUMNS)}) VALUES ("
    + ", ".join(
        f"{_DB_NOW} + ${n}::double precision" if column == "lease_expires_at" else f"${n}"
        for n, column in enumerate(_SESSION_COLUMNS, start=1)
    )
    + ") ON CONFLICT (session_id) DO NOTHING RETURNING *"
)
_RENEW_LEASES = f"""
    UPDATE {{s}}.sessions SET owner = $2, lease_expires_at = {_DB_NOW} + $3
    WHERE session_id = ANY($1::text[])
    AND (owner = '' OR owner = $2 OR lease_expires_at <= {_DB_NOW})
    RETURNING session_id
"""
# One statement: the CTE tells "no such session" apart from "held by someone else".
# A racing acquirer blocks on the row lock, then re-checks the WHERE on the new row.
_ACQUIRE_LEASE = f"""
    WITH target AS (SELECT 1 FROM {{s}}.sessions WHERE session_id = $1),
    taken AS (
        UPDATE {{s}}.sessions SET owner = $2, lease_expires_at = {_DB_NOW} + $3
        WHERE session_id = $1 AND (owner = '' OR owner = $2 OR lease_expires_at <= {_DB_NOW})
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM target) AS found, EXISTS (SELECT 1 FROM taken) AS taken
"""


def _columns(obj: Any) -> dict[str, Any]:
    """A record's fields as column values: statuses by value, nested data as JSON."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, SessionStatus):
            value = value.value
        elif isinstance(value, Usage):
            value = json.dumps(dataclasses.asdict(value))
        elif isinstance(value, dict | list):
            value = json.dumps(value)
        values[f.name] = value
    return values


def _session_from_row(row: Any) -> SessionRecord:
    fields = {name: row[name] for name in _SESSION_COLUMNS}
    fields["status"] = SessionStatus(row["status"])
    fields["metadata"] = json.loads(row["metadata"])
    fields["usage"] = Usage(**json.loads(row["usage"]))
    return SessionRecord(**fields)


def _ref_from_row(row: Any) -> SubSessionRef:
    fields = {name: row[name] for name in _REF_COLUMNS}
    return SubSessionRef(**fields | {"status": SessionStatus(row["status"])})
