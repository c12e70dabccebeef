"""``Interrupt(abort=True)``: a session and its subtree end TERMINATED, never resumed.

Contract: an abort ends the run with a ``terminated`` event (its usage and the
subtree's, as the other terminal events) and status TERMINATED; it cascades to the
remote children as an ``abort`` command through the parent's outbox, so each child
ends TERMINATED too, also when its service is down when the abort is sent and back
later. A terminated session is only continued ``fresh``.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from helix_transport import AgentClient, SessionStateConflict, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents import counter, delegator
from tests.delegation.test_remote_crash import CHILD, _service, _stream_until_child_step
from tests.helpers import assert_eventually, free_port

LONG = json.dumps({"calls": [{"tool": "count", "args": {"steps": 40, "words": 2}}]})


def _payload(event: pb.StreamEvent) -> str:
    return str(event.WhichOneof("payload"))


def _child_id(events: list[pb.StreamEvent]) -> str:
    starts = [e.subagent_start for e in events if _payload(e) == "subagent_start"]
    assert len(starts) == 1, starts
    return starts[0].child_session_id


async def test_an_abort_ends_the_session_and_its_remote_child_terminated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "30")  # the child runs for seconds
    parent_store, child_store = MemoryStore(), MemoryStore()
    async with AsyncExitStack() as stack:
        child_server = await stack.enter_async_context(
            await create_server(counter, child_store, allow_unauthenticated=True)
        )
        monkeypatch.setenv(address_env_var(counter.name), child_server.address)
        parent_server = await stack.enter_async_context(
            await create_server(delegator, parent_store, allow_unauthenticated=True)
        )
        client, child_client = [
            await stack.enter_async_context(await AgentClient.connect(server.address))
            for server in (parent_server, child_server)
        ]
        await client.start(LONG, session_id="root")
        async with asyncio.timeout(30):
            seen = await _stream_until_child_step(client, 2)
        child = _child_id(seen)
        reply = await client.interrupt("root", reason="stop everything", abort=True)
        async with asyncio.timeout(30):
            rest = [e async for e in client.stream("root", from_sequence=seen[-1].sequence)]
            child_status = await child_client.wait(child)
        child_log = [e async for e in child_client.stream(child)]
        status = await client.get_status("root")
        with pytest.raises(SessionStateConflict, match="fresh"):
            await client.continue_session("root", LONG, turn=2)
        with pytest.raises(SessionStateConflict, match="fresh"):
            await child_client.continue_session(child, "more", turn=2)

        # The outbox let the abort go once the child's service took it.
        async def delivered() -> bool:
            return not await parent_store.list_commands(limit=10)

        await assert_eventually(delivered, timeout_s=20)

    assert reply.accepted
    end = rest[-1]
    assert _payload(end) == "terminated", end
    assert end.terminated.reason == "stop everything"
    assert end.terminated.usage.total_tokens > 0
    assert end.terminated.total_usage.total_tokens >= end.terminated.usage.total_tokens
    assert "interrupted" not in [_payload(e) for e in rest]
    assert status.status == pb.SESSION_STATUS_TERMINATED
    assert child_status.status == pb.SESSION_STATUS_TERMINATED, child_status
    assert _payload(child_log[-1]) == "terminated"
    assert child_log[-1].terminated.usage.total_tokens > 0
    # Stopped early: the child never got near its 40 steps.
    steps = [e for e in child_log if _payload(e) == "step_started"]
    assert len(steps) < 40


async def test_a_plain_interrupt_after_an_abort_does_not_soften_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "30")
    store = MemoryStore()
    async with (
        await create_server(counter, store, allow_unauthenticated=True) as server,
        await AgentClient.connect(server.address) as client,
    ):
        # Recorded before the run begins, so both are pending when it first looks.
        await store.set_interrupt("s", "abort", abort=True)
        await store.set_interrupt("s", "only a pause")
        await client.start(json.dumps({"steps": 40, "words": 2}), session_id="s")
        events = [e async for e in client.stream("s")]
        with pytest.raises(SessionStateConflict, match="fresh"):
            await client.continue_session("s", "more", turn=2)
        fresh = await client.continue_session(
            "s", json.dumps({"steps": 1, "words": 1}), turn=2, fresh=True
        )
        again = [e async for e in client.stream("s", from_sequence=fresh.from_sequence)]

    assert _payload(events[-1]) == "terminated" and events[-1].terminated.reason == "abort"
    assert _payload(again[-1]) == "completed"  # a fresh turn of a terminated session runs


async def test_an_abort_sent_while_the_child_service_is_down_reaches_it_when_back(
    tmp_path: Path,
) -> None:
    child = _service("counter", tmp_path, port=free_port(), env={"HELIX_SCRIPTED_DELAY_MS": "50"})
    parent = _service(
        "delegator", tmp_path, port=free_port(), env={"HELIX_AGENT_ADDRESS_COUNTER": child.address}
    )
    long_input = json.dumps({"calls": [{"tool": "count", "args": {"steps": 40, "words": 2}}]})
    await asyncio.gather(child.start(), parent.start())
    try:
        async with await AgentClient.connect(parent.address) as client:
            await client.start(long_input, session_id="root")
            async with asyncio.timeout(60):
                events = await _stream_until_child_step(client, 2)
            await child.kill()
            reply = await client.interrupt("root", reason="abort it all", abort=True)
            assert reply.accepted
            async with asyncio.timeout(60):
                rest = [e async for e in client.stream("root", from_sequence=events[-1].sequence)]
            assert _payload(rest[-1]) == "terminated", rest[-1]
            await parent.kill()  # the outbox is in the parent's store, not its memory
            await asyncio.sleep(1.0)
            await parent.start()
            await child.start()
        async with await AgentClient.connect(child.address) as child_client:
            async with asyncio.timeout(60):
                status = await child_client.wait(CHILD)
            log = [e async for e in child_client.stream(CHILD)]
    finally:
        await asyncio.gather(parent.stop(), child.stop())
    assert status.status == pb.SESSION_STATUS_TERMINATED, status
    assert _payload(log[-1]) == "terminated"
    calls = sum(
        1 for line in (tmp_path / "calls.log").read_text().splitlines()
        if line.split() == ["counter", CHILD]
    )  # fmt: skip
    assert calls < 40, "the child ran on after its parent's abort"
