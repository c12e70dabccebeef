"""How the Redis store encodes records into hash fields and JSON, and decodes them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1.agent_pb2 import StreamEvent
from helix_transport.store._records import (
    Checkpoint,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
    Usage,
)

# Decoders by the annotation of each record field; a field of a new type fails at
# import instead of round-tripping wrongly.
_DECODERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "float | None": lambda s: float(s) if s else None,
    "SessionStatus": SessionStatus,
    "dict[str, str]": json.loads,
    "Usage": lambda s: Usage(**json.loads(s)),
}
_SESSION_DECODERS = {f.name: _DECODERS[str(f.type)] for f in dataclasses.fields(SessionRecord)}
# Fields a hash written by an older helix-mesh lacks; the record's default applies.
_ADDED_LATER = frozenset({"principal", "tenant"})


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


def _field_pairs(obj: SessionRecord | SessionUpdate) -> list[str]:
    """Field/value pairs of a record; of an update, only of the fields it changes."""
    return [
        item
        for f in dataclasses.fields(obj)
        if isinstance(obj, SessionRecord) or getattr(obj, f.name) is not None
        for item in (f.name, _encode(getattr(obj, f.name)))
    ]


def _decode_session(raw: Any) -> SessionRecord:
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


def _serialize_unsequenced(event: StreamEvent) -> bytes:
    previous = event.sequence
    event.sequence = 0  # proto3 omits a zero field, so no stale sequence is stored
    try:
        return event.SerializeToString()
    finally:
        event.sequence = previous


def _ref_to_json(ref: SubSessionRef) -> str:
    return json.dumps(dataclasses.asdict(ref))


def _ref_from_json(raw: bytes) -> SubSessionRef:
    data = json.loads(raw)
    data["status"] = SessionStatus(data["status"])
    data.pop("remote", None)  # a cursor refs written before carried; nothing read it
    return SubSessionRef(**data)


def _checkpoint_json(checkpoint: Checkpoint) -> str:
    """The checkpoint as stored; raises (``TypeError``) when it is not JSON."""
    return json.dumps(dataclasses.asdict(checkpoint))
