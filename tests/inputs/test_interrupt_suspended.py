"""Interrupt and abort of a session waiting for a person, over real gRPC.

Contract: a SUSPENDED session cannot be continued (its turn is not over, even
``fresh``). It has no run to see an interrupt, so ``Interrupt`` starts
one (``run_resumed`` reason ``interrupt``) that takes it at its first step boundary.
A plain interrupt ends it INTERRUPTED, and ``Continue`` without ``fresh`` resumes it
with its memory: the call that waited for the person is answered
``{"error": "interrupted"}`` and never runs. An abort ends it, and the suspended child
it waits on, TERMINATED; neither can be continued but ``fresh``.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

import pytest

from helix_transport import AgentClient, SessionStateConflict, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents.approvals import mailer, middle


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("payload") or ""


async def until_suspended(client: AgentClient, session_id: str) -> list[pb.StreamEvent]:
    seen: list[pb.StreamEvent] = []
    async with asyncio.timeout(30):
        async for event in client.stream(session_id):
            seen.append(event)
            if kind(event) == "suspended":
                return seen
    raise AssertionError(f"never suspended: {[kind(e) for e in seen]}")


async def test_an_interrupted_suspended_session_resumes_with_its_memory() -> None:
    store = MemoryStore()
    async with (
        await create_server(mailer, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        await client.start('{"to": "x@example.com"}', session_id="w1")
        waiting = await until_suspended(client, "w1")
        call_id = next(e.input_required.request_id for e in waiting if kind(e) == "input_required")
        with pytest.raises(SessionStateConflict, match="suspended for input"):
            await client.continue_session("w1", "{}", turn=2, fresh=True)
        reply = await client.interrupt("w1", reason="not now")
        async with asyncio.timeout(30):
            rest = [e async for e in client.stream("w1", from_sequence=waiting[-1].sequence)]
        turn = await client.continue_session("w1", "carry on without sending", turn=2)
        async with asyncio.timeout(30):
            second = [e async for e in client.stream("w1", from_sequence=turn.from_sequence)]
        checkpoint = await store.load_checkpoint("w1")

    assert reply.accepted and reply.status == pb.SESSION_STATUS_SUSPENDED
    assert kind(rest[0]) == "run_resumed" and rest[0].run_resumed.reason == "interrupt"
    assert kind(rest[-1]) == "interrupted" and rest[-1].interrupted.reason == "not now"
    assert not second[0].turn_started.fresh and kind(second[-1]) == "completed"
    # The gated call never ran: answered "interrupted" in the conversation kept.
    started = [e.tool_start.tool_name for e in rest + second if kind(e) == "tool_start"]
    assert started == ["__finish__"]
    assert checkpoint is not None
    messages = checkpoint.messages
    answered = [m for m in messages if m.get("role") == "tool" and m["tool_call_id"] == call_id]
    assert [json.loads(m["content"]) for m in answered] == [{"error": "interrupted"}]
    at = messages.index(answered[0])
    assert messages[at + 1] == {"role": "user", "content": "carry on without sending"}
    assert messages[1]["content"] == json.dumps(
        {"to": "x@example.com", "body": "hello"}, separators=(",", ":")
    )  # the first turn's input, remembered


async def test_an_abort_ends_a_suspended_tree_terminated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with AsyncExitStack() as stack:
        child_server = await stack.enter_async_context(
            await create_server(mailer, MemoryStore(), allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(mailer.name), child_server.address)
        parent_server = await stack.enter_async_context(
            await create_server(middle, MemoryStore(), allow_unauthenticated=True)
        )
        client, child_client = [
            await stack.enter_async_context(await AgentClient.connect(server.address))
            for server in (parent_server, child_server)
        ]
        await client.start('{"to": "y@example.com"}', session_id="w2")
        waiting = await until_suspended(client, "w2")
        (child,) = [
            e.subagent_start.child_session_id for e in waiting if kind(e) == "subagent_start"
        ]
        assert (await child_client.get_status(child)).status == pb.SESSION_STATUS_SUSPENDED
        reply = await client.interrupt("w2", reason="cancel it all", abort=True)
        async with asyncio.timeout(30):
            rest = [e async for e in client.stream("w2", from_sequence=waiting[-1].sequence)]
            child_status = await child_client.wait(child)
        child_log = [e async for e in child_client.stream(child)]
        for c, session_id in ((client, "w2"), (child_client, child)):
            with pytest.raises(SessionStateConflict, match="fresh"):
                await c.continue_session(session_id, "again", turn=2)

    assert reply.accepted
    assert kind(rest[-1]) == "terminated" and rest[-1].terminated.reason == "cancel it all"
    assert child_status.status == pb.SESSION_STATUS_TERMINATED, child_status
    assert kind(child_log[-1]) == "terminated"
    assert "tool_start" not in [kind(e) for e in child_log]  # the mail was never sent
    assert "tool_start" not in [kind(e) for e in rest]
