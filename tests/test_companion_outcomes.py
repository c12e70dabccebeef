"""Companion turns driven by hand (the tools called directly, a real critic service on
127.0.0.1): a finished turn's outcome reaches the parent's model exactly once, also
when the parent messages the child again before it has looked.

Contract: ``send_message``, or a spawn that re-consults, to a child whose finished
turn the parent's model has not seen shows that outcome (``previous_turn``) and
marks it delivered; the step hook then pushes only the new turn's outcome.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from helix_transport import AgentClient, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import ToolContext
from helix_transport.companions import (
    Companions,
    PersistentChild,
    SendArgs,
    SpawnArgs,
    child_session_id,
)
from helix_transport.store import MemoryStore
from helix_transport.transport._pool import ClientPool
from services.critic import agent as critic

PARENT = "parent"
CHILD = child_session_id(PARENT, "critic-1")


class Parent:
    """One parent run's tool contexts, sharing its state, and the events they emit."""

    def __init__(self, clients: ClientPool) -> None:
        self.events: list[pb.StreamEvent] = []
        self.state: dict[str, Any] = {}
        self.clients = clients
        self.store = MemoryStore()
        self.calls = 0

    def ctx(self) -> ToolContext:
        self.calls += 1

        async def flush() -> None:
            return None

        return ToolContext(
            session_id=PARENT, agent_type="parent", tool_call_id=f"call_{self.calls}", step=1,
            metadata={}, emit=self.events.append, flush=flush, store=self.store,
            clients=self.clients, state=self.state,
        )  # fmt: skip

    def delivered_rounds(self) -> list[int]:
        """The critic's round in each ``subagent_end`` the parent logged."""
        return [
            json.loads(e.subagent_end.output_json)["round"]
            for e in self.events
            if e.WhichOneof("payload") == "subagent_end"
        ]


@pytest.fixture
async def parent() -> AsyncIterator[Parent]:
    clients = ClientPool()
    try:
        yield Parent(clients)
    finally:
        await clients.aclose()


@pytest.fixture
async def child() -> AsyncIterator[tuple[Companions, AgentClient]]:
    async with (
        await create_server(critic, MemoryStore(), allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        tools = Companions(
            [PersistentChild(agent_type="critic", mode="non-blocking", input_field="artifact",
                             address=server.address)]
        )  # fmt: skip
        yield tools, client


@pytest.mark.parametrize("how", ["send_message", "spawn_agent"])
async def test_a_message_after_an_unseen_turn_shows_that_turns_outcome_once(
    how: str, child: tuple[Companions, AgentClient], parent: Parent
) -> None:
    tools, client = child
    await tools._spawn(parent.ctx(), SpawnArgs(agent="critic", message="v1"))
    first = await client.wait(CHILD)  # it finished; the parent's model has not looked
    if how == "send_message":
        sent = await tools._send(parent.ctx(), SendArgs(name="critic-1", message="v2 tests"))
    else:
        args = SpawnArgs(agent="critic", message="v2 tests", name="critic-1")
        sent = await tools._spawn(parent.ctx(), args)
    pushed_early = await tools.deliver_finished(parent.ctx(), [])  # turn 2 may still run
    await client.wait(CHILD, after_sequence=first.last_sequence)
    pushed = await tools.deliver_finished(parent.ctx(), []) or pushed_early

    assert first.status == pb.SESSION_STATUS_COMPLETED
    assert sent["status"] == "running"
    assert sent["previous_turn"]["status"] == "completed"
    assert sent["previous_turn"]["output"]["round"] == 1
    # Only turn 2 is pushed: turn 1 was shown by the tool's result.
    assert len(pushed) == 1 and '"round":2' in pushed[0]["content"]
    assert '"round":1' not in pushed[0]["content"]
    assert parent.delivered_rounds() == [1, 2]
