"""Scenario 10: A2A streams. The same agent's stream through its A2A endpoint (the
official a2a-sdk client, JSON-RPC over SSE) beside its native gRPC stream, and beside
the a2a-sdk reference server (``DefaultRequestHandler``, in-memory task store, an
executor publishing as many events as fast as it can) read by the same client.

All in this process over 127.0.0.1, so each side pays the same in-process cost.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from helix_transport._optional import requires

with requires("a2a", "the A2A bench rows"):
    import uvicorn
    from a2a.client import Client, ClientConfig, create_client
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
    from a2a.types import a2a_pb2 as a2a
    from starlette.applications import Starlette

from helix_transport._config import ServerConfig
from helix_transport.bench._measure import Ids
from helix_transport.bench._report import Report, ratio_at_least
from helix_transport.bench.agents import leaf, leaf_input
from helix_transport.bench.streams import bench_store
from helix_transport.server.app import create_server
from helix_transport.testing.processes import free_port
from helix_transport.transport import AgentClient

TARGET = 20.0
"""Our A2A stream against the reference server's, in events/s (issue 50, target 8)."""


@dataclass
class _Best:
    """The best of ``repeat`` streams: log events delivered per second, and the A2A
    updates that carried them (per second, and in the best stream)."""

    events_per_s: float = 0.0
    updates_per_s: float = 0.0
    events: int = 0
    updates: int = 0


async def _per_second(count: Callable[[], Awaitable[tuple[int, int]]], repeat: int) -> _Best:
    best = _Best()
    for _ in range(repeat):
        started = time.perf_counter()
        events, updates = await count()
        seconds = time.perf_counter() - started
        if events / seconds > best.events_per_s:
            best = _Best(events / seconds, updates / seconds, events, updates)
    return best


def covered(response: a2a.StreamResponse) -> int:
    """How many log events one update delivers: the sequences its ``metadata.helix``
    covers (``first_sequence`` .. ``sequence``: helix joins text deltas a reader is
    behind on), else one (the reference server sends one update per event)."""
    which = response.WhichOneof("payload")
    if which not in ("status_update", "artifact_update"):
        return 0  # the Task snapshot (or a message): no event
    metadata = getattr(response, which).metadata.fields
    helix = metadata["helix"].struct_value.fields if "helix" in metadata else {}
    if "first_sequence" in helix:
        return int(helix["sequence"].number_value - helix["first_sequence"].number_value) + 1
    return 1


@asynccontextmanager
async def _a2a_client(url: str) -> AsyncIterator[Client]:
    """The a2a-sdk client of ``url`` (its card fetched): made before the clock starts
    for both servers, as the native row's client is connected before."""
    async with httpx.AsyncClient(timeout=300) as http:
        yield await create_client(url, client_config=ClientConfig(httpx_client=http))


async def _a2a_count(client: Client, request: a2a.SendMessageRequest) -> tuple[int, int]:
    """One stream to its end: (log events delivered, A2A updates received)."""
    events = updates = 0
    async for response in client.send_message(request):
        n = covered(response)
        events += n
        updates += n > 0
    return events, updates


def _leaf_message(events: int) -> a2a.SendMessageRequest:
    message = a2a.Message(message_id=uuid.uuid4().hex, role=a2a.ROLE_USER)
    message.parts.add().data.struct_value.update({"mode": "emit", "n": events})
    return a2a.SendMessageRequest(message=message)


class _Emitter(AgentExecutor):
    """The reference agent: ``events`` working updates, then completed."""

    def __init__(self, events: int) -> None:
        self.events = events

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        task = a2a.Task(id=task_id, context_id=context_id)
        task.status.state = a2a.TASK_STATE_SUBMITTED
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task_id, context_id)
        for n in range(self.events):
            part = a2a.Part(text=f"w{n} ")
            await updater.add_artifact([part], artifact_id="text", append=n > 0)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


@asynccontextmanager
async def reference_server(events: int) -> AsyncIterator[str]:
    """The a2a-sdk reference server (no helix in it) on a free port; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    card = a2a.AgentCard(name="reference", description="emits", version="1")
    card.supported_interfaces.add(url=url + "/", protocol_binding="JSONRPC", protocol_version="1.0")
    card.capabilities.streaming = True
    handler = DefaultRequestHandler(_Emitter(events), InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # raises what stopped it
        await asyncio.sleep(0.01)
    try:
        yield url
    finally:
        server.should_exit = server.force_exit = True
        await task


async def a2a_streams(report: Report, tmp: Path, ids: Ids, *, events: int, repeat: int) -> None:
    """Scenario 10 on the memory store (the store's cost is scenarios 1-3's).

    The rate is of log events the client received (by the sequences each update
    covers): helix sends a reader that is behind its consecutive text deltas as one
    update, the reference server one update per event; both counts are in the row."""
    scenario = f"10 A2A stream, {events:,} events"
    async with (
        bench_store("memory", tmp) as store,
        await create_server(
            leaf, store, ServerConfig(a2a_port=0), allow_unauthenticated=True
        ) as server,
        await AgentClient.connect(server.address) as client,
    ):
        assert server.a2a is not None

        async def native() -> tuple[int, int]:
            session_id = ids("a2a-native")
            await client.start(leaf_input(mode="emit", n=events), session_id=session_id)
            received = sum([1 async for _ in client.stream(session_id)])
            return received, received

        async with _a2a_client(server.a2a.url) as a2a_client:
            ours = await _per_second(lambda: _a2a_count(a2a_client, _leaf_message(events)), repeat)
        base = await _per_second(native, repeat)
        report.add(
            scenario,
            "memory, in-process",
            "events/s",
            ours.events_per_s,
            base.events_per_s,
            f"helix native gRPC stream (A2A: {ours.events:,} log events "
            f"in {ours.updates:,} updates, {ours.updates_per_s:,.0f} updates/s)",
        )
    async with reference_server(events) as reference, _a2a_client(reference) as a2a_client:
        theirs = await _per_second(lambda: _a2a_count(a2a_client, _leaf_message(events)), repeat)
    report.add(
        f"{scenario}, beside the a2a-sdk reference server",
        "memory, in-process",
        "events/s",
        ours.events_per_s,
        theirs.events_per_s,
        "a2a-sdk DefaultRequestHandler + InMemoryTaskStore, same client, one update per "
        f"event ({theirs.updates:,} updates; helix: {ours.events:,} log events "
        f"in {ours.updates:,} updates, {ours.updates_per_s:,.0f} updates/s)",
        ratio_at_least(TARGET),
    )
