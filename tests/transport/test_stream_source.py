"""EventStream talks to its service only through StreamSource, AgentClient's small
interface for it: a source other than AgentClient drives the same resumable stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from helix_transport import AgentClient, EventStream
from helix_transport._config import ClientConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.transport.stream import StreamCall, StreamSource
from tests.agents import counter
from tests.conftest import Serve


class _Cut:
    """A Stream call that ends cleanly after ``keep`` responses, as a drained server's does."""

    def __init__(self, call: StreamCall, keep: int) -> None:
        self._call, self._keep = call, keep

    async def _responses(self) -> AsyncIterator[Any]:
        kept = 0
        async for response in self._call:
            yield response
            kept += 1
            if kept == self._keep:
                return

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses()

    def cancel(self) -> bool:
        return self._call.cancel()


class CuttingSource:
    """A StreamSource over an AgentClient that cuts every Stream call short and
    records what the stream asked of it."""

    def __init__(self, client: AgentClient) -> None:
        self._client = client
        self.address = client.address
        self.config: ClientConfig = client.config
        self.from_sequences: list[int] = []
        self.status_calls = 0
        self.waits: list[float] = []

    def stream_call(self, request: pb.StreamRequest, *, encoded: bool = False) -> StreamCall:
        self.from_sequences.append(request.from_sequence)
        return _Cut(self._client.stream_call(request, encoded=encoded), keep=1)

    async def status_call(self, session_id: str) -> pb.GetStatusResponse:
        self.status_calls += 1
        return await self._client.status_call(session_id)

    async def reconnected(self, *, within_s: float) -> None:
        self.waits.append(within_s)  # the channel is up: no need to wait


async def test_an_event_stream_resumes_through_its_source_alone(serve: Serve) -> None:
    async with serve(counter) as (_, client):
        await client.start(json.dumps({"steps": 3, "words": 2}), session_id="s")
        source = CuttingSource(client)
        checked: StreamSource = source
        stream = EventStream(checked, "s", from_sequence=0)
        sequences = [event.sequence async for event in stream]
        ended = await client.wait("s")

    assert sequences == list(range(1, ended.last_sequence + 1))
    # Every cut call was followed by a status check, a wait, then a call resumed from
    # the last sequence delivered: the stream's whole traffic went through the source.
    assert source.from_sequences[0] == 0 and source.from_sequences == sorted(source.from_sequences)
    assert len(source.from_sequences) >= 2 and stream.reconnects == len(source.from_sequences) - 1
    assert source.status_calls >= stream.reconnects and len(source.waits) == stream.reconnects
