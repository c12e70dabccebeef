"""Stream responses encoded from event bytes equal what protobuf would build, and fit\nthe server's message limit."""

from __future__ import annotations

import json

import pytest

from helix_transport import AgentClient, Limits, ServerConfig, SessionStatus, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.log import EventHub, SessionWriter
from helix_transport.server._encoding import MAX_RESPONSE_BYTES, encode_responses
from helix_transport.store import MemoryStore, SessionRecord, SessionUpdate
from tests.agents import counter


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


def test_a_batch_of_a_few_events_splits_at_a_smaller_budget_heads_counted() -> None:
    batch = [_event(i + 1, 1000) for i in range(20)]
    each = pb.StreamResponse(events=batch[:1]).ByteSize()  # the event and its field header
    responses = encode_responses(_encoded(batch), most=each * 3)
    assert [len(pb.StreamResponse.FromString(r).events) for r in responses] == [3] * 6 + [2]
    assert all(len(r) <= each * 3 for r in responses)


async def test_a_server_with_a_small_message_limit_streams_a_log_of_large_events() -> None:
    # Each 100 KiB result fits the 256 KiB limit (results may take half of it), but the
    # replay packed four into one 400 KiB response, over the server's send limit: the
    # reader failed RESOURCE_EXHAUSTED at the same place on every reconnect.
    store = MemoryStore()
    record = SessionRecord(session_id="s", agent_type="counter", input_json="{}", input_hash="")
    await store.create_session(record)
    writer = SessionWriter(store, EventHub(), session_id="s", agent_type="counter", last_sequence=0)
    result = json.dumps("r" * (100 << 10))
    for i in range(4):
        writer.emit(pb.StreamEvent(tool_end=pb.ToolEnd(tool_call_id=f"c{i}", result_json=result)))
    await writer.finish(
        pb.StreamEvent(completed=pb.Completed(output_json="{}")),
        SessionUpdate(status=SessionStatus.COMPLETED),
    )
    config = ServerConfig(limits=Limits(max_message_bytes=256 << 10, max_input_bytes=1 << 10))
    async with (
        await create_server(counter, store, config, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        events = [event async for event in client.stream("s")]
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5]
    assert events[-1].WhichOneof("payload") == "completed"
