"""Stream responses encoded from event bytes equal what protobuf would build."""

from __future__ import annotations

import pytest

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.server._encoding import MAX_RESPONSE_BYTES, encode_responses


def _event(sequence: int, text_size: int) -> pb.StreamEvent:
    event = pb.StreamEvent(text_delta=pb.TextDelta(text="x" * text_size))
    event.sequence = sequence
    event.session_id = "s-1"
    return event


def _encoded(batch: list[pb.StreamEvent]) -> list[bytes]:
    return [event.SerializeToString() for event in batch]


@pytest.mark.parametrize(
    "sizes",
    [
        [0],
        [1, 2, 3],
        # Event sizes on both sides of each varint length boundary (1, 2, 3 bytes).
        [0x70, 0x7F, 0x80, 0x81, 0x3FF0, 0x3FFF, 0x4000, 0x4001, 0x20000],
    ],
)
def test_one_response_is_byte_for_byte_protobufs_own(sizes: list[int]) -> None:
    batch = [_event(i + 1, size) for i, size in enumerate(sizes)]
    assert encode_responses(_encoded(batch)) == [
        pb.StreamResponse(events=batch).SerializeToString()
    ]


def test_a_large_batch_splits_below_the_limit_and_keeps_every_event_in_order() -> None:
    batch = [_event(i + 1, 100_000) for i in range(25)]  # about 2.4 MiB in all
    responses = [pb.StreamResponse.FromString(data) for data in encode_responses(_encoded(batch))]
    assert len(responses) == 3
    assert all(r.ByteSize() <= MAX_RESPONSE_BYTES for r in responses)
    assert [e for r in responses for e in r.events] == batch


def test_an_event_over_the_limit_goes_alone() -> None:
    batch = [_event(1, 10), _event(2, MAX_RESPONSE_BYTES + 1), _event(3, 10)]
    responses = [pb.StreamResponse.FromString(data) for data in encode_responses(_encoded(batch))]
    assert [[e.sequence for e in r.events] for r in responses] == [[1], [2], [3]]


def test_no_events_no_responses() -> None:
    assert encode_responses([]) == []
