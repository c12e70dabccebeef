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
from datetime import timedelta

import pytest

from helix_transport import AgentClient, ClientConfig, RetryConfig, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore, SessionRecord, SubSessionRef
from services.researcher import agent as researcher
from tests.agents import counter, delegator
from tests.agents.companions import coordinator, planner


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


class RefsAfterAnInterrupt(MemoryStore):
    """A shared store whose first child ref is written only once ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = asyncio.Event()
        self.gate = asyncio.Event()

    async def put_subsession_ref(self, ref: SubSessionRef) -> None:
        if not self.writing.is_set():
            self.writing.set()
            await self.gate.wait()
        await super().put_subsession_ref(ref)


async def test_a_child_started_after_another_replica_cascaded_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Replica B takes the Interrupt and cascades to the children recorded then: none.
    # Replica A, running the parent, sees the interrupt only at its next poll and
    # meanwhile records and starts a child. Before, that child ran to its end: the
    # parent's run ended interrupted and nothing asked again.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
    shared = RefsAfterAnInterrupt()
    async with AsyncExitStack() as stack:
        child_server = await stack.enter_async_context(
            await create_server(counter, MemoryStore(), allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(counter.name), child_server.address)
        replicas = [
            await stack.enter_async_context(
                await create_server(delegator, shared, allow_unauthenticated=True)
            )
            for _ in range(2)
        ]
        a, b, child = [
            await stack.enter_async_context(await AgentClient.connect(server.address))
            for server in (*replicas, child_server)
        ]
        calls = [{"tool": "count", "args": {"steps": 30, "words": 2}}]
        await a.start(json.dumps({"calls": calls}), session_id="root")
        async with asyncio.timeout(10):
            await shared.writing.wait()  # A is about to record the child
        assert (await b.interrupt("root", reason="stop")).accepted
        shared.gate.set()
        events = [e async for e in a.stream("root")]
        assert events[-1].WhichOneof("payload") == "interrupted"
        (ref,) = await shared.list_subsession_refs("root")
        async with asyncio.timeout(15):
            status = await child.wait(ref.child_session_id)
    assert status.status == pb.SESSION_STATUS_INTERRUPTED, status


async def test_a_child_whose_call_timed_out_during_its_start_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `count_quickly` gives up after 0.5 s, while the child's service is still creating
    # the session. Before, the one interrupt it sent found no session; the child then
    # ran to its end, its ref already failed.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "100")
    slow = SlowToCreate(delay_s=1.0)
    async with AsyncExitStack() as stack:
        child_server = await stack.enter_async_context(
            await create_server(counter, slow, allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(counter.name), child_server.address)
        parent_server = await stack.enter_async_context(
            await create_server(delegator, MemoryStore(), allow_unauthenticated=True)
        )
        client, child_client = [
            await stack.enter_async_context(await AgentClient.connect(server.address))
            for server in (parent_server, child_server)
        ]
        calls = [{"tool": "count_quickly", "args": {"steps": 30, "words": 2}}]
        await client.start(json.dumps({"calls": calls}), session_id="root")
        events = [e async for e in client.stream("root")]
        ends = [e.tool_end for e in events if e.WhichOneof("payload") == "tool_end"]
        assert ends[0].is_error and "timed out after 0.5s" in ends[0].result_json
        async with asyncio.timeout(15):
            async with slow.changed:  # the Start landed after all
                await slow.changed.wait_for(lambda: len(slow.created) == 1)
            status = await child_client.wait(slow.created[0])
    assert status.status == pb.SESSION_STATUS_INTERRUPTED, status


async def test_a_child_out_of_reach_past_the_reconnect_deadline_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The child's service goes away for twice the parent's reconnect deadline. Before,
    # the parent's call failed after the deadline and the root completed without the
    # child's answer; now an unreachable child is waited for (delegation retries with no
    # deadline) and the root gets the child's real output, the child having run once.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "50")
    patience = ClientConfig(
        reconnect=RetryConfig(
            max_backoff=timedelta(milliseconds=200), deadline=timedelta(seconds=3)
        )
    )
    child_store = MemoryStore()
    first = await create_server(counter, child_store, allow_unauthenticated=True)
    await first.start()
    port = int(first.address.rsplit(":", 1)[1])
    monkeypatch.setenv(address_env_var(counter.name), first.address)
    async with (
        await create_server(
            delegator, MemoryStore(), ServerConfig(client=patience), allow_unauthenticated=True
        ) as parent,
        await AgentClient.connect(parent.address) as client,
    ):
        calls = [{"tool": "count", "args": {"steps": 8, "words": 2}}]
        await client.start(json.dumps({"calls": calls}), session_id="root")
        seen: list[pb.StreamEvent] = []
        async for event in client.stream("root"):
            seen.append(event)
            if event.WhichOneof("payload") == "child_event":
                break  # the child runs
        await first.shutdown(grace_s=0)
        await asyncio.sleep(6.0)
        status = await client.get_status("root")
        assert status.status == pb.SESSION_STATUS_RUNNING, "the parent gave up on its child"
        # Back on the same port and store: the child resumes, the parent rejoins it.
        again = await create_server(
            counter, child_store, ServerConfig(port=port), allow_unauthenticated=True
        )
        async with again:
            async with asyncio.timeout(30):
                status = await client.wait("root")
    assert status.status == pb.SESSION_STATUS_COMPLETED, status
    assert json.loads(status.output_json) == {"results": [{"total": 8, "steps": 8}]}
