"""How the Redis store encodes a session record into its hash's fields, and decodes it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.store._records import (
    SessionRecord,
    SessionUpdate,
    Usage,
)

# Decoders by the annotation of each record field; a field of a new type fails at
# import instead of round-tripping wrongly.
_DECODERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "float | None": lambda s: float(s) if s else None,
    "int | None": lambda s: int(s) if s else None,
    "SessionStatus": SessionStatus,
    "dict[str, str]": json.loads,
    "Usage": lambda s: Usage(**json.loads(s)),
}
_SESSION_DECODERS = {f.name: _DECODERS[str(f.type)] for f in dataclasses.fields(SessionRecord)}
# Fields a hash written by an older helix-mesh lacks; the record's default applies.
_ADDED_LATER = frozenset(
    {"principal", "tenant", "deadline", "budget_tokens", "budget_usd", "limit_exceeded"}
)


def _encode(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, SessionStatus):
        return value.value
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)  # repr round-trips a float exactly
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Usage):
        return json.dumps(dataclasses.asdict(value))
    return json.dumps(value)


def field_pairs(obj: SessionRecord | SessionUpdate) -> list[str]:
    """Field/value pairs of a record; of an update, only of the fields it changes."""
    return [
        item
        for f in dataclasses.fields(obj)
        if isinstance(obj, SessionRecord) or getattr(obj, f.name) is not None
        for item in (f.name, _encode(getattr(obj, f.name)))
    ]


def decode_session(raw: Any) -> SessionRecord:
    """A record from HGETALL: a dict from redis-py, a flat list from a script."""
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    fields = {name.decode(): value.decode() for name, value in raw.items()}
    return SessionRecord(
        **{
            name: decode(fields[name])
            for name, decode in _SESSION_DECODERS.items()
            if name not in _ADDED_LATER or name in fields
        }
    )
