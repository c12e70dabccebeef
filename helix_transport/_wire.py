"""Protobuf wire-format pieces for passing events along as bytes.

A parent forwards every event of its child into its own log, and a server sends
every event to its readers: both already hold each event serialized, so they
build the few surrounding bytes (a field header, a length, a sequence number)
instead of parsing, copying and serializing the event again. Everything here
follows the protobuf encoding: a field is a varint key (``number << 3 | wire
type``) then, for length-delimited fields, a varint length and the bytes;
concatenated encodings of one message merge into one.

Reading goes the other way for a request grpc could not parse: ``undecodable``
walks its raw bytes to name the field at fault, so the caller gets
``INVALID_ARGUMENT`` naming it instead of grpc's ``UNKNOWN`` with a Python class name
(a ``string`` field holding invalid UTF-8 fails before any handler runs).

All hand-written protobuf framing is in this module, over one varint reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from helix_transport._exceptions import InvalidArgument

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]

SEQUENCE_KEY = b"\x08"
"""``StreamEvent.sequence``: field 1, varint."""
CHILD_EVENT_KEY = b"\xc2\x01"
"""``StreamEvent.child_event``: field 24, length-delimited."""
_TOOL_CALL_ID_KEY = b"\x0a"
"""``ChildEvent.tool_call_id``: field 1, length-delimited."""
_EVENT_KEY = b"\x12"
"""``ChildEvent.event``: field 2, length-delimited."""


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf varint."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:  # sequences up to 16,383 and most event sizes: no loop
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_LOW_SEQUENCES = [SEQUENCE_KEY + bytes((n | 0x80,)) for n in range(0x80)]
"""The key and first byte of a two-byte sequence, by its low seven bits."""
_ONE_BYTE_SEQUENCES = [SEQUENCE_KEY + one for one in _ONE_BYTE]


def sequenced_all(first: int, head: bytes, bodies: Sequence[bytes]) -> list[bytes]:
    """Each event's bytes with its sequence (``first``, ``first + 1``...), from ``head +
    body`` without one: the sequence is field 1, so this is also how protobuf lays it out.

    In one pass for a batch: per-event function calls were most of the cost. From 128
    on, a sequence's first byte is its low seven bits and the rest is the varint of
    what is above them, shared by 128 sequences in a row: that part goes in front of
    ``head`` once for each 128 (a byte string built per event was half the cost).
    """
    out: list[bytes] = []
    count = len(bodies)
    at = 0
    while at < count:
        n = first + at
        if n < 0x80:
            stop = min(count, 0x80 - first)
            one = _ONE_BYTE_SEQUENCES
            out += [one[n] + head + body for n, body in enumerate(bodies[at:stop], n)]
        else:
            stop = min(count, (n | 0x7F) + 1 - first)
            low, high = _LOW_SEQUENCES, varint(n >> 7) + head
            out += [low[n & 0x7F] + high + body for n, body in enumerate(bodies[at:stop], n)]
        at = stop
    return out


def child_event_prefix(tool_call_id: str) -> bytes:
    """The start of a ``ChildEvent`` (its ``tool_call_id``), shared by a call's events."""
    raw = tool_call_id.encode()
    return _TOOL_CALL_ID_KEY + varint(len(raw)) + raw


def child_event_payload(prefix: bytes, event: bytes) -> bytes:
    """``StreamEvent.child_event`` wrapping one child event's bytes."""
    size = varint(len(event))
    return (
        CHILD_EVENT_KEY
        + varint(len(prefix) + 1 + len(size) + len(event))
        + prefix
        + _EVENT_KEY
        + size
        + event
    )


def child_event_payloads(prefix: bytes, events: Sequence[bytes]) -> list[bytes]:
    """``child_event_payload`` of each of ``events``."""
    # A one-byte size is the usual case (a delta's event is ~60 bytes); inlined, as a
    # function call per event cost as much as the bytes.
    one, inner = _ONE_BYTE, len(prefix) + 2
    return [
        CHILD_EVENT_KEY + varint(inner + n) + prefix + _EVENT_KEY + one[n] + event
        if (n := len(event)) < 0x80
        else child_event_payload(prefix, event)
        for event in events
    ]


def repeated_field(message: bytes, number: int) -> list[bytes] | None:
    """The bytes of every entry of a length-delimited field ``number`` in ``message``.

    ``None`` when the bytes are not a well-formed message (the caller falls back to
    the parsed message)."""
    parts: list[bytes] = []
    index, end = 0, len(message)
    short_key = number << 3 | 2 if number < 16 else -1
    try:
        while index < end:
            # The usual entry, inlined: this field, one-byte key and size.
            if message[index] == short_key and (size := message[index + 1]) < 0x80:
                index += 2
                parts.append(message[index : index + size])
                index += size
                continue
            key, index = read_varint(message, index)
            wire = key & 7
            if wire == 2:
                size, index = read_varint(message, index)
                if key >> 3 == number:
                    parts.append(message[index : index + size])
                index += size
            elif wire == 0:
                _, index = read_varint(message, index)
            elif wire == 1:
                index += 8
            elif wire == 5:
                index += 4
            else:
                return None
    except (IndexError, _Malformed):
        return None
    return parts if index == end else None


class _Malformed(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(data: bytes, index: int) -> tuple[int, int]:
    """The varint at ``data[index]`` and the index after it.

    Raises:
        IndexError: the data ends inside it.
        _Malformed: it runs past 64 bits (10 bytes), which no encoder writes.
    """
    byte = data[index]
    if byte < 0x80:
        return byte, index + 1
    value, shift = byte & 0x7F, 7
    while True:
        index += 1
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
        if shift > 63:
            raise _Malformed


_MAX_NESTING = 32


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


def _bad_string(descriptor: Descriptor | None, data: bytes, prefix: str, depth: int) -> str | None:
    """The path of the first string field in ``data`` that is not UTF-8, if any."""
    if depth > _MAX_NESTING:
        raise _Malformed
    at = 0
    while at < len(data):
        tag, at = read_varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            _, at = read_varint(data, at)
            continue
        if wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            continue
        if wire_type != 2:
            raise _Malformed  # groups are not used by these messages
        length, at = read_varint(data, at)
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
