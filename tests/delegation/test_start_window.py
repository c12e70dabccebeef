"""A fan-out's ``Start``s go a window at a time (``delegation.starts``), its children still
run all at once: two real services on 127.0.0.1, the child's store counting the sessions
it is creating at each moment."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from helix_transport import AgentClient, AgentServer, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.delegation import starts
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents import counter, delegator


class _CountsCreates(MemoryStore):
    """Each session's creation takes 20 ms; ``most`` is the most created at once."""

    def __init__(self) -> None:
        super().__init__()
        self.creating = 0
        self.most = 0

    async def create_session(self, *args: Any, **kwargs: Any) -> Any:
        self.creating += 1
        self.most = max(self.most, self.creating)
        try:
            await asyncio.sleep(0.02)
            return await super().create_session(*args, **kwargs)
        finally:
            self.creating -= 1


@pytest.fixture
async def services(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[AgentClient, Any]]:
    monkeypatch.setattr(starts, "START_WINDOW", 3)
    child_store = _CountsCreates()
    servers: list[AgentServer] = []
    for agent, store in ((counter, child_store), (delegator, MemoryStore())):
        server = await create_server(agent, store, ServerConfig(), allow_unauthenticated=True)
        await server.start()
        servers.append(server)
        monkeypatch.setenv(address_env_var(agent.name), server.address)
    client = await AgentClient.connect(servers[-1].address)
    try:
        yield client, child_store
    finally:
        await client.aclose()
        for server in reversed(servers):
            await server.shutdown(grace_s=1)


async def _run(client: AgentClient, *calls: dict[str, int]) -> list[pb.StreamEvent]:
    tools = [{"tool": "count", "args": args} for args in calls]
    await client.start(json.dumps({"calls": tools}), session_id="root")
    return [event async for event in client.stream("root")]


async def test_a_fan_out_keeps_a_window_of_starts_in_flight(
    services: tuple[AgentClient, _CountsCreates],
) -> None:
    client, child_store = services
    events = await _run(client, *[{"steps": 1, "words": 0}] * 12)
    results = json.loads(events[-1].completed.output_json)["results"]
    assert results == [{"total": 1, "steps": 1}] * 12
    # Without the window all 12 Starts reach the child's service at once.
    assert child_store.most == 3


async def test_started_children_run_at_once_whatever_the_window(
    services: tuple[AgentClient, _CountsCreates], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(starts, "START_WINDOW", 1)
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "20")
    client, _ = services
    events = await _run(client, *[{"steps": 3, "words": 2}] * 4)
    seen = [e.child_event.tool_call_id for e in events if e.WhichOneof("payload") == "child_event"]
    first = {call: seen.index(call) for call in set(seen)}
    last = {call: len(seen) - 1 - seen[::-1].index(call) for call in set(seen)}
    # Every child streamed before any of them finished: the window held only the Starts.
    assert len(first) == 4 and max(first.values()) < min(last.values())
