"""A drain (``shutdown``) leaves every session for the next owner whole: a Start in
flight as it begins runs nowhere here, and an interrupt a cancelled run was taking
goes back to the store."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.store import Interrupt, MemoryStore, SessionRecord
from tests.agents import counter

CONFIG = ServerConfig(replica_id="r1", lease_ttl_s=1.0)


class _HeldCreate(MemoryStore):
    """``create_session`` waits at a gate: a Start that is in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def create_session(self, record: SessionRecord, **kwargs: Any) -> Any:
        self.entered.set()
        await self.gate.wait()
        return await super().create_session(record, **kwargs)


async def test_a_start_in_flight_as_the_drain_begins_runs_only_after_the_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It registered its run after the drain had listed the runs to stop: the run
    # outlived shutdown(), and the restarted replica ran the session at the same time.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "10")
    store = _HeldCreate()
    old = await create_server(counter, store, CONFIG, allow_unauthenticated=True)
    await old.start()
    async with await AgentClient.connect(old.address) as client:
        start = asyncio.create_task(
            client.start(json.dumps({"steps": 5, "words": 2}), session_id="late")
        )
        await store.entered.wait()
        shutdown = asyncio.create_task(old.shutdown(grace_s=0))
        await asyncio.sleep(0.01)
        store.gate.set()
        await shutdown
        start.cancel()
    assert old.runner.running == 0
    new = await create_server(counter, store, CONFIG, allow_unauthenticated=True)
    async with new, await AgentClient.connect(new.address) as client:
        status = await client.wait("late")
        events = [e async for e in client.stream("late")]
    assert status.status == pb.SESSION_STATUS_COMPLETED
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds.count("step_started") == 6  # 5 ticks and the finish: none ran twice
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))


class _SlowToTakeAnInterrupt(MemoryStore):
    """The reply of a ``take_interrupt`` that took one is slow to come."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = asyncio.Event()

    async def take_interrupt(self, session_id: str) -> Interrupt | None:
        taken = await super().take_interrupt(session_id)
        if taken is not None:
            self.taken.set()
            await asyncio.sleep(0.3)
        return taken


async def test_an_interrupt_a_drained_run_was_taking_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cancelled mid-take, the run dropped the reason the store had already cleared: the
    # resumed run completed though the Interrupt had been accepted.
    monkeypatch.setenv("HELIX_SCRIPTED_DELAY_MS", "5")
    store = _SlowToTakeAnInterrupt()
    first = await create_server(counter, store, CONFIG, allow_unauthenticated=True)
    await first.start()
    async with await AgentClient.connect(first.address) as client:
        await client.start(json.dumps({"steps": 10, "words": 3}), session_id="s")
        async for event in client.stream("s"):
            if event.WhichOneof("payload") == "step_started":
                break
        await store.set_interrupt("s", "stop please")  # as an Interrupt on another replica
        await store.taken.wait()
        await first.shutdown(grace_s=0)
    second = await create_server(counter, store, CONFIG, allow_unauthenticated=True)
    async with second, await AgentClient.connect(second.address) as client:
        async with asyncio.timeout(20):
            events = [e async for e in client.stream("s")]
    assert events[-1].WhichOneof("payload") == "interrupted"
    assert events[-1].interrupted.reason == "stop please"
