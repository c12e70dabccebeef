"""A reader checks the sequences a server sends: each event once, in order, no gap, and
it stops at the terminal event. In both the parsed and the bytes-keeping (forwarding)
modes of ``EventStream``, against a server that sends exactly the responses given."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import grpc
import pytest

from helix_transport import AgentClient, ClientConfig, RetryConfig
from helix_transport._exceptions import SequenceGap
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.helpers import serve_stream

Responses = list[list[int]]
"""Each response as the sequences of its events; the last of all is ``completed``."""


def _event(sequence: int, *, last: bool) -> pb.StreamEvent:
    event = pb.StreamEvent(sequence=sequence, session_id="s-1", agent_type="scripted")
    if last:
        event.completed.output_json = "{}"
    else:
        event.text_delta.text = f"delta {sequence} " + "x" * (sequence % 3) * 70
    return event


@asynccontextmanager
async def _server(responses: Responses, final: int) -> AsyncIterator[str]:
    """Sends ``responses`` on every ``Stream``, then keeps the stream open."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[pb.StreamResponse]:
        for sequences in responses:
            yield pb.StreamResponse(events=[_event(n, last=n == final) for n in sequences])
        await asyncio.sleep(30)  # the reader must stop at the terminal event on its own

    async with serve_stream(stream, serializer=pb.StreamResponse.SerializeToString) as address:
        yield address


Read = Callable[[AgentClient], AsyncIterator[tuple[list[pb.StreamEvent], list[bytes]]]]


async def _parsed(client: AgentClient) -> AsyncIterator[tuple[list[pb.StreamEvent], list[bytes]]]:
    async for batch in client.stream("s-1").batches():
        yield batch, [event.SerializeToString() for event in batch]


async def _kept(client: AgentClient) -> AsyncIterator[tuple[list[pb.StreamEvent], list[bytes]]]:
    async for pair in client.stream("s-1").encoded_batches():
        yield pair


MODES = pytest.mark.parametrize("read", [_parsed, _kept], ids=["parsed", "bytes"])


async def _read(
    responses: Responses, read: Read, *, final: int | None = None
) -> list[pb.StreamEvent]:
    """What ``read`` gives of ``responses``, whose event ``final`` (by default the
    last) is ``completed``."""
    final = final or max(max(r) for r in responses)
    events: list[pb.StreamEvent] = []
    async with (
        _server(responses, final) as address,
        await AgentClient.connect(address) as client,
    ):
        async with asyncio.timeout(10):
            async for batch, data in read(client):
                assert data == [event.SerializeToString() for event in batch]
                events += batch
    return events


@MODES
@pytest.mark.parametrize(
    "responses",
    [
        [[1, 2, 3], list(range(4, 300)), [300]],  # whole responses
        [[1, 2, 3], [2, 3, 4, 5], [5, 6]],  # overlaps, as after a reconnect
        [[1, 2, 2, 3], [4]],  # a repeat inside one response
    ],
    ids=["whole", "overlapping", "repeated"],
)
async def test_each_event_once_in_order_up_to_the_terminal_one(
    responses: Responses, read: Read
) -> None:
    events = await _read(responses, read)
    final = max(max(r) for r in responses)
    assert [event.sequence for event in events] == list(range(1, final + 1))
    assert events[-1].WhichOneof("payload") == "completed"


@MODES
@pytest.mark.parametrize(
    "responses",
    [[[1, 2, 4]], [[1, 2], [4, 5]], [[1, 3, 2, 4]]],
    ids=["inside", "between", "out-of-order"],
)
async def test_a_gap_is_a_sequence_gap(responses: Responses, read: Read) -> None:
    with pytest.raises(SequenceGap):
        await _read(responses, read)


@MODES
@pytest.mark.parametrize(
    "responses", [[[1, 2, 3, 4, 5]], [[1], [2, 3, 4], [5]]], ids=["in one", "in several"]
)
async def test_the_reader_stops_at_the_terminal_event_even_when_more_follow(
    responses: Responses, read: Read
) -> None:
    # As a continued session's log: turn 1 ends at 3, turn 2 follows.
    events = await _read(responses, read, final=3)
    assert [event.sequence for event in events] == [1, 2, 3]


async def test_a_quiet_stream_broken_again_and_again_resumes_each_time() -> None:
    # Each call is answered (a heartbeat) and then dropped, as a proxy that cuts long
    # streams or a rolling restart does, while the session is quiet; the fifth call
    # brings its end. Before, the reconnect deadline (1 s here) counted from the first
    # break across every reconnect that worked, and the stream failed StreamInterrupted.
    calls = 0

    async def stream(request: bytes, context: Any) -> AsyncIterator[pb.StreamResponse]:
        nonlocal calls
        calls += 1
        yield pb.StreamResponse(heartbeat=pb.Heartbeat())
        if calls < 5:
            await asyncio.sleep(0.4)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        end = pb.StreamEvent(session_id="q", sequence=1, completed=pb.Completed(output_json="{}"))
        yield pb.StreamResponse(events=[end])

    quick = ClientConfig(reconnect=RetryConfig(deadline=timedelta(seconds=1)))
    async with (
        serve_stream(stream, serializer=pb.StreamResponse.SerializeToString) as address,
        await AgentClient.connect(address, config=quick) as client,
    ):
        events = client.stream("q")
        received = [e async for e in events]
    assert [e.WhichOneof("payload") for e in received] == ["completed"]
    assert events.reconnects == 4


@MODES
async def test_a_finished_stream_leaves_no_generator_for_the_loop_to_close(read: Read) -> None:
    # grpc's response generator is closed when the stream ends, not left to the garbage
    # collector, which has the event loop close it in a task of its own (one a stream).
    finalized: list[str] = []
    loop = asyncio.get_running_loop()
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen: Any) -> None:
        finalized.append(agen.__qualname__)
        loop._asyncgen_finalizer_hook(agen)  # type: ignore[attr-defined]

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        events = await _read([[1, 2], [3]], read)
        gc.collect()
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert [event.sequence for event in events] == [1, 2, 3]
    assert not [name for name in finalized if "fetch_stream_responses" in name]
