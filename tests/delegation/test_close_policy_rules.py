"""Close policies: declared and validated with each child kind, read back for a recorded
child by its id, and carried out by the outbox only once the parent has ended.

A companion whose parent completes while it runs with a message queued is terminated,
and the parent's log says the message was never delivered.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from helix_transport import Agent, AgentClient, ClosePolicy, UsageError, create_server
from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._closing import close_children
from helix_transport.agent.close_policy import ChildKind, child_kind
from helix_transport.agent.tools import child_scope, derived_session_id
from helix_transport.delegation.cascade import Cascade
from helix_transport.delegation.companions import PersistentChild, child_session_id
from helix_transport.delegation.dispatch import SubagentType
from helix_transport.delegation.remote import remote_agent_tool
from helix_transport.registry import address_env_var
from helix_transport.store import (
    ChildCommand,
    MemoryStore,
    SessionRecord,
    SessionUpdate,
    SubSessionRef,
)
from helix_transport.transport import ClientPool
from services.critic import agent as critic
from tests.agents.closing import CloserInput, CloserOutput, leaver


def test_wait_is_refused_where_a_parent_cannot_hold_for_it() -> None:
    SubagentType(agent_type="researcher", close_policy=ClosePolicy.WAIT)  # batches wait
    with pytest.raises(UsageError, match="WAIT is for run_subagent tasks only"):
        PersistentChild(agent_type="critic", close_policy=ClosePolicy.WAIT)
    with pytest.raises(UsageError, match="WAIT is for run_subagent tasks only"):
        remote_agent_tool("research", agent_type="researcher", close_policy=ClosePolicy.WAIT)


def test_a_policy_is_the_enum_not_a_string() -> None:
    with pytest.raises(UsageError, match="must be a ClosePolicy"):
        SubagentType(agent_type="researcher", close_policy="wait")  # type: ignore[arg-type]


def test_one_kind_and_type_with_two_policies_is_refused_at_definition() -> None:
    tools = [
        remote_agent_tool("a", agent_type="researcher", close_policy=ClosePolicy.ABANDON),
        remote_agent_tool("b", agent_type="researcher"),
    ]
    with pytest.raises(UsageError, match="two close policies"):
        Agent(
            name="twice",
            description="",
            input_model=CloserInput,
            output_model=CloserOutput,
            model="scripted/x",
            tools=tools,
        )


def test_a_recorded_childs_policy_is_read_by_its_kind_and_type() -> None:
    agent = Agent(
        name="reader",
        description="",
        input_model=CloserInput,
        output_model=CloserOutput,
        model="scripted/x",
        tools=[remote_agent_tool("r", agent_type="researcher", close_policy=ClosePolicy.ABANDON)],
    )
    scope = child_scope("reader", "")
    remote = derived_session_id("p", "remote", "call_1", scope)
    task = derived_session_id("p", "task", "call_1-0", scope)
    assert agent.close_policy_of("p", remote, "researcher") is ClosePolicy.ABANDON
    assert agent.close_policy_of("p", task, "researcher") is ClosePolicy.TERMINATE  # undeclared
    # The digested form (an id too long, or with characters an id may not have).
    digested = derived_session_id("p" * 500, "task", "call/1", scope)
    assert child_kind("p" * 500, digested) is ChildKind.TASK
    assert child_kind("p", "someone-else") is None


async def test_a_close_command_waits_for_its_parent_to_end() -> None:
    # Written before the parent's terminal write: while the parent is still running
    # (killed between the two writes and resumed), its children are left alone.
    store = MemoryStore()
    record = SessionRecord(session_id="p", agent_type="closer", input_json="{}", input_hash="")
    await store.create_session(record)
    clients = ClientPool()
    async with await create_server(critic, MemoryStore(), allow_unauthenticated=True) as child:
        cascade = Cascade(store, clients)
        # A child its service does not know, asked long ago: delivered means dropped.
        command = ChildCommand(
            parent_session_id="p",
            child_session_id="p-task-gone",
            address=child.address,
            kind="close",
            created_at=time.time() - 3600,
        )
        await store.put_commands([command])
        await cascade.deliver([command])
        assert [c.child_session_id for c in await store.list_commands()] == ["p-task-gone"]
        await store.update_session("p", SessionUpdate(status=SessionStatus.COMPLETED))
        await cascade.deliver([command])
        assert await store.list_commands() == []
        await clients.aclose()


async def test_an_interrupted_parent_tells_its_children_the_interrupt_s_reason() -> None:
    # The Interrupt's own cascade and the run's end both ask the child to stop; which
    # arrives first is a race, so both carry the words the person gave. The parent's
    # log still says what the policy did and why.
    store = MemoryStore()
    await store.create_session(
        SessionRecord(session_id="p", agent_type="closer", input_json="{}", input_hash="")
    )
    await store.put_subsession_ref(
        SubSessionRef(
            parent_session_id="p",
            child_session_id="p-c",
            agent_type="critic",
            tool_call_id="t1",
            address="127.0.0.1:1",
        )
    )
    ends = {
        "enough": SessionStatus.INTERRUPTED,
        "stop it all": SessionStatus.TERMINATED,
        "": SessionStatus.INTERRUPTED,
    }
    told = []
    for reason, status in ends.items():
        closing = await close_children(
            leaver, store, session_id="p", status=status, run=None, reason=reason
        )
        [command], [event] = closing.commands, closing.events
        told.append((command.kind, command.reason, event.close_policy_applied.reason))
    assert told == [
        ("close", "enough", "parent p interrupted"),
        ("abort", "stop it all", "parent p terminated"),
        ("close", "parent p interrupted", "parent p interrupted"),
    ]


async def test_a_companion_running_when_its_parent_completes_is_terminated_and_its_queue_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "300")  # the critic takes seconds
    async with (
        await create_server(critic, MemoryStore(), allow_unauthenticated=True) as child,
        await AgentClient.connect(child.address) as children,
    ):
        monkeypatch.setenv(address_env_var("critic"), child.address)
        async with (
            await create_server(leaver, MemoryStore(), allow_unauthenticated=True) as server,
            await AgentClient.connect(server.address) as client,
        ):
            await client.start(json.dumps({"drafts": ["v1", "v2"]}), session_id="l")
            events = [e async for e in client.stream("l")]
            name = child_session_id("l", "critic", child_scope("leaver", ""))
            async with asyncio.timeout(10):
                ended = await children.wait(name)

    assert events[-1].HasField("completed")
    [applied] = [e.close_policy_applied for e in events if e.HasField("close_policy_applied")]
    assert applied.child_session_id == name
    assert applied.policy == pb.CLOSE_POLICY_TERMINATE
    assert applied.action == pb.CLOSE_ACTION_TERMINATED
    assert applied.undelivered_messages == 1  # queued, never sent: said, not lost
    # In the same write as the parent's end: right before its output and completion.
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[-3:] == ["close_policy_applied", "output", "completed"]
    assert ended.status == pb.SESSION_STATUS_INTERRUPTED
