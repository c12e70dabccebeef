"""Why a request's bytes did not parse, named by field.

grpc parses a request before any handler runs; a ``string`` field holding invalid
UTF-8 (or bytes that are no protobuf at all) fails there. This walks the protobuf
wire format of the raw bytes to say which field is at fault, so the caller gets
``INVALID_ARGUMENT`` naming it instead of grpc's ``UNKNOWN`` with a Python class name.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from helix_transport._exceptions import InvalidArgument

_MAX_NESTING = 32


class _Malformed(Exception):
    pass


def undecodable(message_type: Any, raw: bytes) -> InvalidArgument:
    """The ``InvalidArgument`` for ``raw``, which failed to parse as ``message_type``."""
    descriptor: Descriptor | None = getattr(message_type, "DESCRIPTOR", None)
    name = descriptor.full_name if descriptor is not None else "message"
    try:
        found = _bad_string(descriptor, raw, "", 0)
    except (_Malformed, IndexError):
        found = None
    if found is not None:
        return InvalidArgument(found, "not valid UTF-8")
    return InvalidArgument("request", f"cannot be parsed as a {name} (malformed protobuf)")


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift > 63:
            raise _Malformed
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _bad_string(descriptor: Descriptor | None, data: bytes, prefix: str, depth: int) -> str | None:
    """The path of the first string field in ``data`` that is not UTF-8, if any."""
    if depth > _MAX_NESTING:
        raise _Malformed
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, at = _varint(data, at)
            continue
        if wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            continue
        if wire_type != 2:
            raise _Malformed  # groups are not used by these messages
        length, at = _varint(data, at)
        payload = data[at : at + length]
        if len(payload) != length:
            raise _Malformed
        at += length
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        if field is None:
            continue
        path = prefix + field.name
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                return path
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = field.message_type
            if (
                inner is not None and inner.GetOptions().map_entry
            ):  # metadata: a key or a value, say the map
                if _bad_string(inner, payload, "", depth + 1) is not None:
                    return path
            else:
                found = _bad_string(inner, payload, path + ".", depth + 1)
                if found is not None:
                    return found
    return None
