"""What ``--json`` prints: a protobuf message as plain JSON values.

Protobuf's own JSON mapping writes int64 as strings (``"last_sequence": "39"``) and
leaves our JSON-in-a-string fields escaped (``"output_json": "{\\"a\\": 1}"``), which
every reader must then undo. Here numbers are numbers, a ``*_json`` field is the JSON
it holds under its name less ``_json`` (``output``), a session status is its
lower-case name (``completed``), a timestamp is RFC 3339 in UTC with six fractional
digits, as ``tree.rfc3339`` writes every time (``null`` when unset), a
oneof shows only its set member, and every other field is present, defaults too.
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any, cast

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from helix_transport.tree import rfc3339

_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"


def message_json(message: Message) -> dict[str, Any]:
    """``message`` as a JSON object (see the module docstring)."""
    out: dict[str, Any] = {}
    for field in cast(list[FieldDescriptor], message.DESCRIPTOR.fields):
        oneof = field.containing_oneof
        if oneof is not None and message.WhichOneof(oneof.name) != field.name:
            continue
        value = getattr(message, field.name)
        kind = _message_kind(field)
        if kind == _MAP:
            value_field = field.message_type.fields_by_name["value"]  # type: ignore[union-attr]
            out[field.name] = {key: _single(value_field, item) for key, item in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, item) for item in value]
        elif field.type == FieldDescriptor.TYPE_STRING and field.name.endswith("_json"):
            out.update(_parsed(field.name, value))
        elif kind in (_TIMESTAMP, _DURATION) and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


_MAP = "map"


def _message_kind(field: FieldDescriptor) -> str:
    """The message type's full name, ``map`` for a map field, ``""`` for a scalar."""
    message_type = field.message_type
    if field.type != FieldDescriptor.TYPE_MESSAGE or message_type is None:
        return ""
    return _MAP if message_type.GetOptions().map_entry else message_type.full_name


def _single(field: FieldDescriptor, value: Any) -> Any:
    """One value of ``field`` (one element, for a repeated field)."""
    kind = _message_kind(field)
    if kind == _DURATION:
        return value.ToTimedelta().total_seconds()
    if kind == _TIMESTAMP:
        return rfc3339(value.ToDatetime(tzinfo=UTC))
    if kind:
        return message_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        return enum_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.hex()
    return value


def _parsed(name: str, text: str) -> dict[str, Any]:
    """``{"output": {...}}`` for ``output_json``; an empty field is ``null``. Text that
    is not JSON (a service that broke the contract) stays a string, under its own name."""
    if not text:
        return {name.removesuffix("_json"): None}
    try:
        return {name.removesuffix("_json"): json.loads(text)}
    except ValueError:
        return {name: text}


def enum_name(enum: EnumDescriptor, number: int) -> str:
    """``completed`` for ``SESSION_STATUS_COMPLETED`` (the enum's prefix dropped);
    the number, as text, for a value this build does not know."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = "".join("_" + c if c.isupper() else c.upper() for c in enum.name).lstrip("_") + "_"
    return value.name.removeprefix(prefix).lower()


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """JSON text as ``--json`` prints it (UTF-8 kept, not escaped)."""
    return json.dumps(value, indent=indent, ensure_ascii=False)
