"""How the PostgreSQL store writes records into columns and reads rows back, and the
statement shapes shared by its roles (``{s}`` stands for the quoted schema)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.store._records import SessionRecord, Usage

# Derived from the records so a new field without a migration fails loudly
# ("column ... does not exist") instead of being dropped silently.
SESSION_COLUMNS = [f.name for f in dataclasses.fields(SessionRecord)]
DB_NOW = "extract(epoch FROM clock_timestamp())::double precision"
"""The database's clock, which leases are judged by (every replica shares it)."""


def upsert(table: str, columns: list[str], keys: tuple[str, ...], *, replace: bool) -> str:
    """An INSERT of ``columns`` that, when ``keys`` exist, replaces the rest or does nothing."""
    values = ", ".join(f"${n}" for n in range(1, len(columns) + 1))
    rest = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in keys)
    action = f"DO UPDATE SET {rest}" if replace else "DO NOTHING RETURNING *"
    return (
        f"INSERT INTO {{s}}.{table} ({', '.join(columns)}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(keys)}) {action}"
    )


def columns(obj: Any) -> dict[str, Any]:
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


def session_from_row(row: Any) -> SessionRecord:
    fields = {name: row[name] for name in SESSION_COLUMNS}
    fields["status"] = SessionStatus(row["status"])
    fields["metadata"] = json.loads(row["metadata"])
    fields["usage"] = Usage(**json.loads(row["usage"]))
    return SessionRecord(**fields)
