"""Several replicas of one agent service sharing Redis or PostgreSQL, as real processes.

Any replica serves any session; a replica killed with SIGKILL loses its leases and
another replica takes its sessions over from their checkpoints; a client (or a
parent) streaming through a multi-address target sees one continuous, gapless log.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.delegation.remote import child_session_id
from helix_transport.store import SessionRecord, open_store
from tests.helpers import ROOT, ServiceProcess, free_port

LEASE_TTL = "1"


@dataclass
class Replicas:
    a: ServiceProcess
    b: ServiceProcess
    store_url: str
    workdir: Path

    @property
    def target(self) -> str:
        """Both replicas behind one name, balanced round-robin by the client."""
        return f"ipv4:127.0.0.1:{self.a.port},127.0.0.1:{self.b.port}"

    async def record(self, session_id: str) -> SessionRecord:
        store = await open_store(self.store_url)
        try:
            record = await store.get_session(session_id)
        finally:
            await store.aclose()
        assert record is not None
        return record


def _replica(agent: str, store_url: str, workdir: Path, name: str, **env: str) -> ServiceProcess:
    return ServiceProcess(
        agent,
        port=free_port(),
        store_url=store_url,
        log_path=workdir / f"{name}.log",
        env={"HELIX_SCRIPTED_DELAY_MS": "20", **env},
        extra_args=["--lease-ttl", LEASE_TTL, "--drain-timeout", "0.5"],
        cwd=ROOT,
    )


@pytest.fixture(params=["redis", "postgres"])
async def shared_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    name = f"helix_test_{uuid.uuid4().hex[:16]}"
    if request.param == "redis":
        base = request.getfixturevalue("redis_url")
        yield f"{base}?prefix={name}"
        client = aioredis.Redis.from_url(base)
        async for key in client.scan_iter(match=f"{name}:*", count=1000):
            await client.delete(key)
        await client.aclose()
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        yield f"{dsn}?schema={name}"
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


@pytest.fixture
async def replicas(shared_url: str, tmp_path: Path) -> AsyncIterator[Replicas]:
    a = _replica("tests.agents:counter", shared_url, tmp_path, "a")
    b = _replica("tests.agents:counter", shared_url, tmp_path, "b")
    await asyncio.gather(a.start(), b.start())
    try:
        yield Replicas(a=a, b=b, store_url=shared_url, workdir=tmp_path)
    finally:
        await asyncio.gather(a.stop(), b.stop())


def _sound(events: list[pb.StreamEvent]) -> None:
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[-1].WhichOneof("payload") == "completed"


async def test_any_replica_serves_a_session_started_on_another(replicas: Replicas) -> None:
    async with (
        await AgentClient.connect(replicas.a.address) as on_a,
        await AgentClient.connect(replicas.b.address) as on_b,
    ):
        await on_a.start(json.dumps({"steps": 3, "words": 8}), session_id="s1")
        # A long poll on B, for a session A runs: B learns the end from the store.
        answered: list[float] = []

        async def poll() -> pb.GetStatusResponse:
            # The time is taken in the task itself: a done callback could still be queued
            # when the test reads it (the poll ended in the loop turn the stream did).
            reply = await on_b.get_status("s1", wait=timedelta(seconds=30))
            answered.append(time.monotonic())
            return reply

        long_poll = asyncio.create_task(poll())
        arrivals: list[float] = []
        events: list[pb.StreamEvent] = []
        async for event in on_b.stream("s1"):
            arrivals.append(time.monotonic())
            events.append(event)
        status = await on_b.get_status("s1")
        polled = await long_poll

    _sound(events)
    assert status.status == pb.SESSION_STATUS_COMPLETED and status.last_sequence == len(events)
    assert polled.status == pb.SESSION_STATUS_COMPLETED and polled.last_sequence == len(events)
    assert abs(answered[0] - arrivals[-1]) < 1.0, answered[0] - arrivals[-1]
    # The model streams a word every 20 ms on replica A. A polling reader on B would
    # see batches every poll interval (500 ms); the store's notifier makes it prompt.
    text_gaps = [
        arrivals[i + 1] - arrivals[i]
        for i in range(len(events) - 1)
        if events[i].WhichOneof("payload") == events[i + 1].WhichOneof("payload") == "text_delta"
    ]
    assert statistics.median(text_gaps) < 0.2, text_gaps


async def test_interrupt_through_another_replica(replicas: Replicas) -> None:
    async with (
        await AgentClient.connect(replicas.a.address) as on_a,
        await AgentClient.connect(replicas.b.address) as on_b,
    ):
        await on_a.start(json.dumps({"steps": 40, "words": 3}), session_id="s1")
        events: list[pb.StreamEvent] = []
        async for event in on_b.stream("s1"):
            events.append(event)
            if event.WhichOneof("payload") == "step_started" and event.step == 2:
                reply = await on_b.interrupt("s1", reason="from B")
                assert reply.accepted
        status = await on_a.get_status("s1")

    assert events[-1].WhichOneof("payload") == "interrupted"
    assert events[-1].interrupted.reason == "from B"
    assert status.status == pb.SESSION_STATUS_INTERRUPTED
    assert status.step_count < 10  # stopped at a step boundary, long before the end


async def test_interrupt_through_another_replica_stops_the_run_mid_step(
    replicas: Replicas,
) -> None:
    # One step streams 200 words at 20 ms each (4 s). Replica B only stores the
    # interrupt; A looks for interrupts of its runs every poll interval (0.5 s), so
    # the step's model call is cut short instead of running to the step's end.
    async with (
        await AgentClient.connect(replicas.a.address) as on_a,
        await AgentClient.connect(replicas.b.address) as on_b,
    ):
        await on_a.start(json.dumps({"steps": 2, "words": 200}), session_id="s1")
        events: list[pb.StreamEvent] = []
        asked = 0.0
        async for event in on_a.stream("s1"):
            events.append(event)
            if event.WhichOneof("payload") == "text_delta" and not asked:
                asked = time.monotonic()
                assert (await on_b.interrupt("s1", reason="from B")).accepted
        took = time.monotonic() - asked
        status = await on_b.get_status("s1")

    assert events[-1].WhichOneof("payload") == "interrupted"
    assert events[-1].interrupted.reason == "from B"
    assert status.status == pb.SESSION_STATUS_INTERRUPTED and status.step_count == 0
    words = sum(1 for e in events if e.WhichOneof("payload") == "text_delta")
    assert words < 100 and took < 2.0, (words, took)


async def test_killed_owner_is_taken_over_and_the_stream_stays_gapless(replicas: Replicas) -> None:
    async with await AgentClient.connect(replicas.target) as client:
        started = [
            await client.start(json.dumps({"steps": 6, "words": 5}), session_id=f"s{i}")
            for i in range(6)
        ]
        assert all(s.created for s in started)
        owner_of = {i: (await replicas.record(f"s{i}")).owner for i in range(6)}
        assert set(owner_of.values()) == {f"local-{replicas.a.port}", f"local-{replicas.b.port}"}, (
            "round-robin should spread sessions over both replicas"
        )
        victim = next(i for i, owner in owner_of.items() if owner == f"local-{replicas.a.port}")
        stream = client.stream(f"s{victim}")
        events: list[pb.StreamEvent] = []
        async for event in stream:
            events.append(event)
            if event.WhichOneof("payload") == "step_started" and event.step == 2:
                await replicas.a.kill()
        others = [[e async for e in client.stream(f"s{i}")] for i in range(6) if i != victim]
        record = await replicas.record(f"s{victim}")

    _sound(events)
    resumed = [e.run_resumed for e in events if e.WhichOneof("payload") == "run_resumed"]
    assert [r.reason for r in resumed] == ["takeover"]
    assert json.loads(events[-1].completed.output_json) == {"total": 6, "steps": 6}
    assert record.owner in ("", f"local-{replicas.b.port}")
    for log in others:  # every session finished, wherever it ran
        _sound(log)


async def test_parent_sees_a_continuous_child_stream_across_a_takeover(
    shared_url: str, tmp_path: Path
) -> None:
    a = _replica("tests.agents:counter", shared_url, tmp_path, "a")
    b = _replica("tests.agents:counter", shared_url, tmp_path, "b")
    await asyncio.gather(a.start(), b.start())
    parent = ServiceProcess(
        "tests.agents:delegator",
        port=free_port(),
        store_url=f"sqlite:///{tmp_path / 'parent.db'}",
        log_path=tmp_path / "parent.log",
        env={"HELIX_AGENT_ADDRESS_COUNTER": f"ipv4:127.0.0.1:{a.port},127.0.0.1:{b.port}"},
        cwd=ROOT,
    )
    await parent.start()
    calls = {"calls": [{"tool": "count", "args": {"steps": 6, "words": 5}}]}
    try:
        async with await AgentClient.connect(parent.address) as client:
            await client.start(json.dumps(calls), session_id="root")
            events: list[pb.StreamEvent] = []
            killed = False
            async for event in client.stream("root"):
                events.append(event)
                inner = (
                    event.child_event.event
                    if event.WhichOneof("payload") == "child_event"
                    else None
                )
                if (
                    not killed
                    and inner is not None
                    and inner.WhichOneof("payload") == "step_started"
                    and inner.step == 2
                ):
                    store = await open_store(shared_url)
                    owner = (
                        await store.get_session(
                            child_session_id("root", "call_1_0", child_scope("delegator", ""))
                        )
                    ).owner  # type: ignore[union-attr]
                    await store.aclose()
                    await (a if owner == f"local-{a.port}" else b).kill()
                    killed = True
    finally:
        await asyncio.gather(parent.stop(), a.stop(), b.stop())

    _sound(events)
    child = [e.child_event.event for e in events if e.WhichOneof("payload") == "child_event"]
    assert [e.sequence for e in child] == list(range(1, len(child) + 1))
    assert [e.WhichOneof("payload") for e in child].count("run_resumed") == 1
    assert json.loads(events[-1].completed.output_json) == {"results": [{"total": 6, "steps": 6}]}
