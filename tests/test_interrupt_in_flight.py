"""An interrupt that reaches a parent while a child's ``Start`` is on its way.

The child's service takes the ``Start`` (a service that took one creates and runs the
session whether or not its caller still waits for the reply) but is slow about it:
the parent is interrupted meanwhile, so the tool call that sent the ``Start`` is
cancelled before the reply. Parents record a child before starting it, and the
interrupt's cascade asks a child its service does not know yet again, until such a
``Start`` would have timed out: the child is stopped once it exists. One test per way
a parent starts children: a remote tool, ``run_subagent``, a companion's spawn.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest

from helix_transport import AgentClient, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore, SessionRecord
from services.researcher import agent as researcher
from tests.agents import counter, delegator
from tests.companion_agents import coordinator, planner


class SlowToCreate(MemoryStore):
    """A store that takes ``delay_s`` to create each session."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.asked = asyncio.Event()
        self.created: list[str] = []
        self.changed = asyncio.Condition()

    async def create_session(
        self, record: SessionRecord, *, lease_ttl_s: float | None = None
    ) -> tuple[SessionRecord, bool]:
        self.asked.set()
        await asyncio.sleep(self.delay_s)
        result = await super().create_session(record, lease_ttl_s=lease_ttl_s)
        async with self.changed:
            self.created.append(record.session_id)
            self.changed.notify_all()
        return result


def spawn_counter() -> dict[str, object]:
    message = json.dumps({"steps": 30, "words": 2})
    return {"tool": "companion__spawn_agent", "args": {"agent": "counter", "message": message}}


CASES = {
    "remote tool": (
        delegator,
        counter,
        {"calls": [{"tool": "count", "args": {"steps": 30, "words": 2}}]},
        1,
    ),
    "run_subagent": (coordinator, researcher, {"topics": ["a", "b", "c"]}, 3),
    "companion": (planner, counter, {"steps": [[spawn_counter()]]}, 1),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_child_started_while_its_parent_is_interrupted_is_stopped(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, child, parent_input, children = CASES[case]
    # Children run for seconds: the cascade asks again with backoff (up to 1 s apart).
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
    slow = SlowToCreate(delay_s=0.5)
    async with AsyncExitStack() as stack:
        child_server = await stack.enter_async_context(
            await create_server(child, slow, allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(child.name), child_server.address)
        parent_server = await stack.enter_async_context(
            await create_server(parent, MemoryStore(), allow_unauthenticated=True)
        )
        client = await stack.enter_async_context(await AgentClient.connect(parent_server.address))
        child_client = await stack.enter_async_context(
            await AgentClient.connect(child_server.address)
        )
        await client.start(json.dumps(parent_input), session_id="root")
        async with asyncio.timeout(10):
            await slow.asked.wait()  # a Start reached the child's service
        assert not slow.created
        await client.interrupt("root", reason="stop")
        events = [e async for e in client.stream("root")]
        assert events[-1].WhichOneof("payload") == "interrupted"
        async with asyncio.timeout(15):
            async with slow.changed:  # the Starts landed after all
                await slow.changed.wait_for(lambda: len(slow.created) == children)
            statuses = [await child_client.wait(c) for c in slow.created]
    assert [s.status for s in statuses] == [pb.SESSION_STATUS_INTERRUPTED] * children, statuses
