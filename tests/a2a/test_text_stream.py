"""The root's text deltas through the A2A endpoint, with the official a2a-sdk client:
the ``text`` artifact's first chunk creates it (``append`` false), later ones append;
a reader behind the writer gets consecutive deltas joined into fewer updates, the
same text, the sequences contiguous, and a resubscription from the last sequence an
update covered misses nothing; the conformance kit passes on such a stream."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.client.client import Client
from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format

from helix_transport import ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a import mapping
from helix_transport.a2a.handler import FROM_SEQUENCE_HEADER
from helix_transport.bench.agents import leaf
from helix_transport.store import MemoryStore
from helix_transport.testing.conformance import format_results, run_conformance
from tests.a2a import _updates


@pytest.fixture
async def url() -> AsyncIterator[str]:
    config = ServerConfig(a2a_port=0)
    async with await create_server(leaf, MemoryStore(), config, allow_unauthenticated=True) as s:
        assert s.a2a is not None
        yield s.a2a.url


async def _client(url: str) -> Client:
    http = httpx.AsyncClient(timeout=60)
    return await create_client(url, client_config=ClientConfig(httpx_client=http))


def _emit(n: int, pace_ms: float = 0) -> a2a.SendMessageRequest:
    """The bench leaf: ``n`` one-character text deltas of the root, then its output."""
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    message.parts.add().data.struct_value.update({"mode": "emit", "n": n, "pace_ms": pace_ms})
    return a2a.SendMessageRequest(message=message)


async def _subscribe(client: Client, task_id: str, after: int) -> list[a2a.StreamResponse]:
    context = ClientCallContext(service_parameters={FROM_SEQUENCE_HEADER: str(after)})
    request = a2a.SubscribeToTaskRequest(id=task_id)
    return [e async for e in client.subscribe(request, context=context)]


def _texts(events: list[a2a.StreamResponse]) -> list[a2a.TaskArtifactUpdateEvent]:
    return [e.artifact_update for e in events if _updates.is_text(e)]


def _kind(event: a2a.StreamResponse) -> str:
    update = event.status_update if event.HasField("status_update") else event.artifact_update
    return str(json_format.MessageToDict(update.metadata)["helix"]["kind"])


async def test_the_first_text_chunk_creates_the_artifact(url: str) -> None:
    client = await _client(url)
    events = [e async for e in client.send_message(_emit(3, pace_ms=20))]
    texts = _texts(events)
    assert [t.append for t in texts] == [False] + [True] * (len(texts) - 1)
    assert _updates.text(events) == "xxx"
    task_id = events[0].task.id
    # A replay from the start creates it again; one from after the first chunk appends.
    replay = await _subscribe(client, task_id, 0)
    assert _texts(replay)[0].append is False and _updates.text(replay) == "xxx"
    first = _updates.covered(next(e for e in events if _updates.is_text(e)))
    assert first is not None
    after = await _subscribe(client, task_id, first[0])
    assert _texts(after)[0].append is True and _updates.text(after) == "xx"


async def test_a_reader_behind_gets_fewer_updates_and_misses_nothing(url: str) -> None:
    n = 3000
    client = await _client(url)
    events = [e async for e in client.send_message(_emit(n))]  # emitted faster than sent
    assert events[-1].status_update.status.state == a2a.TASK_STATE_COMPLETED
    sequences = _updates.sequences(events)
    assert sequences == list(range(1, len(sequences) + 1))
    updates = [e for e in events if _updates.covered(e) is not None]
    assert len(updates) < len(sequences) - n // 2, f"{len(updates)} updates of {len(sequences)}"
    assert _updates.text(events) == "x" * n
    joined = [e for e in updates if (c := _updates.covered(e)) is not None and c[0] < c[1]]
    assert joined and all(_kind(e) == "text_delta" for e in joined)
    # Each other event keeps its own update, in place: tool_start before the text,
    # tool_end after it (a run never crosses one).
    kinds = [_kind(e) for e in updates]
    assert kinds.index("tool_start") < kinds.index("text_delta") < kinds.index("tool_end")
    # Resubscribing from the last sequence of a joined update (mid-text) gives the rest.
    middle = joined[len(joined) // 2]
    span = _updates.covered(middle)
    assert span is not None
    rest = await _subscribe(client, events[0].task.id, span[1])
    assert _updates.sequences(rest) == list(range(span[1] + 1, sequences[-1] + 1))
    seen = events[: events.index(middle) + 1]
    assert _updates.text(seen) + _updates.text(rest) == "x" * n
    assert _texts(rest)[0].append is True


async def test_the_conformance_kit_passes_on_joined_text() -> None:
    config = ServerConfig(a2a_port=0)
    async with await create_server(leaf, MemoryStore(), config, allow_unauthenticated=True) as s:
        assert s.a2a is not None
        results = await run_conformance(
            s.address,
            input_json=json.dumps({"mode": "emit", "n": 2000}),
            a2a_url=s.a2a.url,
            sections=["a2a"],
            timeout_s=60,
        )
    assert all(r.passed for r in results), format_results(results)
    stream = next(r for r in results if r.name == "a2a.stream")
    found = re.search(r": (\d+) updates, 1\.\.(\d+),", stream.detail)
    assert found, stream.detail
    assert int(found[1]) < int(found[2]) - 1000  # the kit saw them joined


def test_a_run_of_text_stops_at_its_size_limit() -> None:
    def delta(sequence: int, text: str) -> pb.StreamEvent:
        return pb.StreamEvent(sequence=sequence, session_id="s", text_delta=pb.TextDelta(text=text))

    big = "y" * (mapping.TEXT_RUN_CHARS // 2)
    events = [delta(1, "a"), delta(2, big), delta(3, big), delta(4, "b")]
    events.append(pb.StreamEvent(sequence=5, session_id="s", output=pb.Output(output_json="1")))
    events.append(delta(6, "c"))
    assert [[e.sequence for e in run] for run in mapping.runs(events)] == [[1, 2, 3], [4], [5], [6]]
