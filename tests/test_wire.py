"""The wire-format helpers build exactly the bytes protobuf would."""

from __future__ import annotations

import pytest

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._wire import (
    child_event_payload,
    child_event_payloads,
    child_event_prefix,
    read_varint,
    repeated_field,
    sequenced_all,
    undecodable,
    varint,
)


def _event(sequence: int, text: str) -> pb.StreamEvent:
    event = pb.StreamEvent(
        sequence=sequence,
        session_id="child",
        agent_type="leaf",
        step=2,
        text_delta=pb.TextDelta(text=text),
    )
    event.time.seconds, event.time.nanos = 1_700_000_000, 123_456_789
    return event


@pytest.mark.parametrize("value", [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 2**31, 2**63 - 1])
def test_varint_is_protobufs(value: int) -> None:
    expected = pb.StreamEvent(sequence=value).SerializeToString()[1:] if value else b"\x00"
    assert varint(value) == expected


@pytest.mark.parametrize("sequence", [1, 127, 128, 300_000])
def test_an_event_sequenced_from_its_body_is_byte_for_byte_protobufs(sequence: int) -> None:
    event = _event(0, "x" * 200)
    body = event.SerializeToString()
    event.sequence = sequence
    assert sequenced_all(sequence, b"", [body]) == [event.SerializeToString()]


@pytest.mark.parametrize("size", [0, 1, 100, 0x3FFF, 0x4000, 70_000])
def test_a_wrapped_child_event_is_the_message_protobuf_builds(size: int) -> None:
    child = _event(7, "y" * size)
    payload = child_event_payload(child_event_prefix("call_1"), child.SerializeToString())
    wrapper = pb.StreamEvent()
    wrapper.child_event.tool_call_id = "call_1"
    wrapper.child_event.event.CopyFrom(child)
    assert payload == wrapper.SerializeToString()


@pytest.mark.parametrize("first", [1, 100, 124, 0x3FFF - 2, 300_000, 2**21 - 3])
def test_a_batch_sequenced_at_once_is_byte_for_byte_protobufs(first: int) -> None:
    head = pb.StreamEvent(session_id="parent", agent_type="root", step=3)
    head.time.seconds = 1_700_000_000
    bodies = [
        pb.StreamEvent(text_delta=pb.TextDelta(text="x" * n)).SerializeToString() for n in range(5)
    ]
    expected = []
    for sequence, n in enumerate(range(5), first):
        event = pb.StreamEvent()
        event.CopyFrom(head)
        event.sequence = sequence
        event.text_delta.text = "x" * n
        expected.append(event.SerializeToString())
    assert sequenced_all(first, head.SerializeToString(), bodies) == expected


def test_a_batch_of_child_events_wraps_each_as_protobuf_does() -> None:
    # Sizes on both sides of a one-byte length, in one batch.
    children = [_event(7, "y" * size).SerializeToString() for size in (0, 80, 90, 100, 5_000)]
    assert len(children[1]) < 0x80 <= len(children[3])
    prefix = child_event_prefix("call_1")
    assert child_event_payloads(prefix, children) == [
        child_event_payload(prefix, child) for child in children
    ]


def test_repeated_field_splits_a_response_into_its_events() -> None:
    events = [_event(n, "z" * n * 40) for n in range(1, 6)]
    message = pb.StreamResponse(events=events).SerializeToString()
    assert repeated_field(message, 1) == [e.SerializeToString() for e in events]
    heartbeat = pb.StreamResponse(heartbeat=pb.Heartbeat(detail="quiet")).SerializeToString()
    assert repeated_field(heartbeat, 1) == []


@pytest.mark.parametrize("broken", [b"\x0a\x05abc", b"\x0a", b"\x0b\x00", b"\x0a\xff"])
def test_repeated_field_refuses_bytes_that_are_not_a_message(broken: bytes) -> None:
    assert repeated_field(broken, 1) is None


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**64 - 1])
def test_the_one_varint_reader_reads_what_varint_writes(value: int) -> None:
    data = b"\xff" + varint(value) + b"\x01"
    assert read_varint(data, 1) == (value, len(data) - 1)


def test_a_varint_past_ten_bytes_is_malformed_for_every_reader() -> None:
    overlong = b"\x80" * 10 + b"\x01"  # 11 bytes: no encoder writes one
    with pytest.raises(ValueError):
        read_varint(overlong, 0)
    with pytest.raises(IndexError):
        read_varint(b"\x80\x80", 0)  # ends inside the varint
    assert repeated_field(overlong, 1) is None
    assert undecodable(pb.StreamRequest, overlong).field == "request"


def test_undecodable_names_the_string_field_that_is_not_utf8() -> None:
    raw = pb.StartRequest(session_id="s", input_json="{}").SerializeToString()
    bad = raw.replace(b"{}", b"\xff\xfe")
    error = undecodable(pb.StartRequest, bad)
    assert (error.field, error.problem) == ("input_json", "not valid UTF-8")
