"""Protobuf wire-format pieces for passing events along as bytes.

A parent forwards every event of its child into its own log, and a server sends
every event to its readers: both already hold each event serialized, so they
build the few surrounding bytes (a field header, a length, a sequence number)
instead of parsing, copying and serializing the event again. Everything here
follows the protobuf encoding: a field is a varint key (``number << 3 | wire
type``) then, for length-delimited fields, a varint length and the bytes;
concatenated encodings of one message merge into one.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def sequenced_all(first: int, head: bytes, bodies: Sequence[bytes]) -> list[bytes]:
    """Each event's bytes with its sequence (``first``, ``first + 1``...), from ``head +
    body`` without one: the sequence is field 1, so this is also how protobuf lays it out.

    In one pass for a batch: per-event function calls were most of the cost.
    """
    one = _ONE_BYTE
    return [
        SEQUENCE_KEY
        + (one[n] if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7)) if n < 0x4000 else varint(n))
        + head
        + body
        for n, body in enumerate(bodies, first)
    ]


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
            key, index = _read_varint(message, index)
            wire = key & 7
            if wire == 2:
                size, index = _read_varint(message, index)
                if key >> 3 == number:
                    parts.append(message[index : index + size])
                index += size
            elif wire == 0:
                _, index = _read_varint(message, index)
            elif wire == 1:
                index += 8
            elif wire == 5:
                index += 4
            else:
                return None
    except IndexError:
        return None
    return parts if index == end else None


def _read_varint(data: bytes, index: int) -> tuple[int, int]:
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
