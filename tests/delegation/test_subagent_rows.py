"""The seeds' rows that were partial, each held by a test.

- ``wait_for_result`` with a timeout that passes returns the timeout marker, and the
  child keeps running.
- ``send_message`` to an interrupted companion starts its next turn with its memory
  (``delivered: true``); to a running one it is queued (``delivered: false``).
- One persistent type declared twice, or one ``run_subagent`` type, is refused.
- A conversation key is checked against the parent: another tenant, principal, agent
  type or parent session, a forged key, or a key of a child still running another task,
  each an error naming why.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from helix_transport import AgentClient
from helix_transport._events import SessionStatus
from helix_transport.agent.tools import RunServices, ToolContext, ToolError, child_scope
from helix_transport.delegation.companions import (
    PersistentChild,
    child_session_id,
    with_companions,
)
from helix_transport.delegation.conversation_keys import ConversationKey, conversation_of, key_of
from helix_transport.delegation.dispatch import SubagentType, with_dispatch
from helix_transport.store import MemoryStore, SubSessionRef
from helix_transport.transport import ClientPool
from tests.agents.subagents import notetaker
from tests.delegation.test_companions import mesh, spawn, use

__all__ = ["mesh"]  # the fixture, shared


async def test_timeout_marker_and_an_interrupted_companion_going_on_with_its_memory(
    mesh: dict[str, AgentClient],
) -> None:
    child_id = child_session_id("ri", "c", child_scope("planner", ""))
    count = json.dumps({"steps": 20, "words": 200})  # counter's messages are its input's JSON
    steps = [
        [spawn("counter", count, name="c")],
        [use("wait_for_result", name="c", timeout_s=0.2)],
        [use("wait_for_result", name="c", timeout_s=60)],  # the child is interrupted meanwhile
        [use("send_message", name="c", message=count)],
        [use("send_message", name="c", message=count), use("wait_for_result", name="c")],
    ]
    client = mesh["planner"]
    await client.start(json.dumps({"steps": steps}), session_id="ri")
    events = []
    async for event in client.stream("ri"):
        events.append(event)
        start = event.tool_start if event.WhichOneof("payload") == "tool_start" else None
        if start is not None and json.loads(start.arguments_json or "{}").get("timeout_s") == 60:
            await mesh["counter"].interrupt(child_id, reason="an operator stopped it")
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    results: list[list[Any]] = json.loads(events[-1].completed.output_json)["results"]
    turn1 = [e async for e in mesh["counter"].stream(child_id)]
    turn2 = [e async for e in mesh["counter"].stream(child_id, from_sequence=turn1[-1].sequence)]

    assert results[0][0]["status"] == "running"
    assert results[1] == [{"name": "c", "status": "timeout", "detail": "still running"}]
    assert results[2][0]["status"] == "interrupted"
    sent = results[3][0]
    assert sent["delivered"] is True and sent["turn"] == 2 and sent["status"] == "running"
    queued, waited = results[4]
    assert queued["delivered"] is False and queued["queued"] == 1
    # Its memory: the second turn counted on from where the first stopped (a fresh one
    # would have ticked 20 times more of its own).
    assert waited["status"] == "completed" and waited["output"]["steps"] == 20, waited
    assert turn1[-1].WhichOneof("payload") == "interrupted"
    assert turn2[0].WhichOneof("payload") == "turn_started"
    ticks = [e for e in turn1 + turn2 if e.WhichOneof("payload") == "tool_start"]
    assert 20 <= len(ticks) <= 21, len(ticks)  # 21: the step the interrupt cut, run again


def test_one_type_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="once"):
        with_companions(
            notetaker,
            [PersistentChild(agent_type="critic"), PersistentChild(agent_type="critic")],
        )
    with pytest.raises(ValueError, match="once"):
        with_dispatch(notetaker, [SubagentType(agent_type="critic")] * 2)


def _ctx(store: MemoryStore, *, session_id: str = "p", agent_type: str = "delegator",
         tenant: str = "t1", principal: str = "alice") -> ToolContext:  # fmt: skip
    async def flush() -> None:
        return None

    return ToolContext(
        session_id=session_id,
        agent_type=agent_type,
        tool_call_id="call_9",
        step=1,
        metadata={},
        emit=lambda _: None,
        run=RunServices(store=store, clients=ClientPool(), flush=flush),
        tenant=tenant,
        principal=principal,
    )


async def test_a_conversation_key_is_checked_against_its_parent() -> None:
    store = MemoryStore()
    ctx = _ctx(store)
    child = "p-task-call_1-0-scope"
    await store.put_subsession_ref(
        SubSessionRef(
            parent_session_id="p",
            child_session_id=child,
            agent_type="notetaker",
            tool_call_id="call_1-0",
            status=SessionStatus.COMPLETED,
        )
    )
    key = key_of(ctx, child)
    assert (await conversation_of(ctx, key, task_id="call_9-0")).child_session_id == child

    async def refused(context: ToolContext, given: str) -> str:
        with pytest.raises(ToolError) as raised:
            await conversation_of(context, given, task_id="call_9-0")
        return raised.value.message

    assert "another tenant" in await refused(_ctx(store, tenant="t2"), key)
    assert "another principal" in await refused(_ctx(store, principal="bob"), key)
    assert "issued to a 'delegator' agent" in await refused(_ctx(store, agent_type="other"), key)
    assert "another parent session" in await refused(_ctx(store, session_id="q"), key)
    assert "not a key" in await refused(ctx, "subagent-@@@")
    assert "not a key" in await refused(ctx, child)  # a session id is not a key
    # Forged: this parent's fields, a child it never had (another parent's, say).
    forged = ConversationKey(
        parent_session_id="p",
        child_session_id="q-task-call_1-0-scope",
        parent_agent_type="delegator",
        tenant="t1",
        principal="alice",
    ).encode()
    assert "names no conversation of this session" in await refused(ctx, forged)
    # Still running another task: continue it once its result is in.
    await store.put_subsession_ref(
        SubSessionRef(
            parent_session_id="p",
            child_session_id=child,
            agent_type="notetaker",
            tool_call_id="call_5-1",
            status=SessionStatus.RUNNING,
        )
    )
    assert "still running (task call_5-1)" in await refused(ctx, key)
    # ... unless it runs for this very task: a resumed parent re-running its own call.
    await conversation_of(ctx, key, task_id="call_5-1")
