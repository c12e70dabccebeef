"""Delegation survives crashes: real processes, SIGKILL, and a dropped network.

A parent service (``delegator``) delegates to a child service (``counter``), each
in its own process with its own SQLite file. The scripted provider logs every
model call (HELIX_SCRIPTED_CALL_LOG), which proves what ran once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helix_transport import AgentClient
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import child_scope
from helix_transport.delegation.remote import child_session_id
from tests.helpers import ROOT, ServiceProcess, TcpProxy, free_port

STEPS = 6
INPUT = json.dumps({"calls": [{"tool": "count", "args": {"steps": STEPS, "words": 6}}]})
CHILD = child_session_id("root", "call_1_0", child_scope("delegator", ""))


@dataclass
class Pair:
    parent: ServiceProcess
    child: ServiceProcess
    workdir: Path

    def model_calls(self, agent: str, session_id: str) -> int:
        lines = (self.workdir / "calls.log").read_text().splitlines()
        return sum(1 for line in lines if line.split() == [agent, session_id])


def _service(
    agent: str,
    workdir: Path,
    *,
    port: int,
    env: dict[str, str],
    reconnect_deadline_s: float | None = None,
) -> ServiceProcess:
    deadline = (
        []
        if reconnect_deadline_s is None
        else ["--reconnect-deadline", f"{reconnect_deadline_s:g}"]
    )
    return ServiceProcess(
        f"tests.agents:{agent}",
        port=port,
        store_url=f"sqlite:///{workdir / (agent + '.db')}",
        log_path=workdir / f"{agent}.log",
        env={
            "HELIX_SCRIPTED_DELAY_MS": "15",
            "HELIX_SCRIPTED_CALL_LOG": str(workdir / "calls.log"),
            **env,
        },
        extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5", *deadline],
        cwd=ROOT,
    )


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    child = _service("counter", tmp_path, port=free_port(), env={})
    parent = _service(
        "delegator", tmp_path, port=free_port(), env={"HELIX_AGENT_ADDRESS_COUNTER": child.address}
    )
    await asyncio.gather(child.start(), parent.start())
    try:
        yield Pair(parent=parent, child=child, workdir=tmp_path)
    finally:
        await asyncio.gather(parent.stop(), child.stop())


def forwarded(events: list[pb.StreamEvent]) -> list[pb.StreamEvent]:
    return [e.child_event.event for e in events if e.WhichOneof("payload") == "child_event"]


def assert_parent_log_is_sound(events: list[pb.StreamEvent]) -> None:
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    child = forwarded(events)
    assert [e.sequence for e in child] == list(range(1, len(child) + 1)), (
        "child event lost or repeated"
    )
    assert child[-1].WhichOneof("payload") == "completed"
    kinds = [e.WhichOneof("payload") for e in events]
    # Once each, across any number of the parent's crashes.
    assert (kinds.count("subagent_start"), kinds.count("subagent_end")) == (1, 1), kinds
    assert events[-1].WhichOneof("payload") == "completed"
    assert json.loads(events[-1].completed.output_json) == {
        "results": [{"total": STEPS, "steps": STEPS}]
    }


async def _stream_until_child_step(client: AgentClient, step: int) -> list[pb.StreamEvent]:
    events: list[pb.StreamEvent] = []
    async for event in client.stream("root"):
        events.append(event)
        inner = event.child_event.event if event.WhichOneof("payload") == "child_event" else None
        if (
            inner is not None
            and inner.WhichOneof("payload") == "step_started"
            and inner.step == step
        ):
            return events
    raise AssertionError("the run ended before the child reached the step")


async def test_child_service_killed_and_restarted(pair: Pair) -> None:
    async with await AgentClient.connect(pair.parent.address) as client:
        await client.start(INPUT, session_id="root")
        stream = client.stream("root")
        events: list[pb.StreamEvent] = []
        crashed = False
        async for event in stream:
            events.append(event)
            inner = (
                event.child_event.event if event.WhichOneof("payload") == "child_event" else None
            )
            if (
                not crashed
                and inner is not None
                and inner.WhichOneof("payload") == "step_started"
                and inner.step == 3
            ):
                crashed = True  # once: the resumed child may announce step 3 again
                await pair.child.kill()
                await pair.child.start()
        async with await AgentClient.connect(pair.child.address) as child_client:
            direct = [e async for e in child_client.stream(CHILD)]

    assert_parent_log_is_sound(events)
    # Exactly the child's own log, each event once, including its resumption marker.
    assert forwarded(events) == direct  # as messages: map entries have no fixed byte order
    assert [e.WhichOneof("payload") for e in direct].count("run_resumed") == 1
    assert STEPS + 1 <= pair.model_calls("counter", CHILD) <= STEPS + 2


async def test_parent_service_killed_and_restarted(pair: Pair) -> None:
    async with await AgentClient.connect(pair.parent.address) as client:
        await client.start(INPUT, session_id="root")
        events = await _stream_until_child_step(client, 2)
        await pair.parent.kill()
        await pair.parent.start()
        events += [e async for e in client.stream("root", from_sequence=events[-1].sequence)]

    assert_parent_log_is_sound(events)
    assert [e.WhichOneof("payload") for e in events].count("run_resumed") == 1
    # The child ran once, start to end: the restarted parent rejoined it.
    assert pair.model_calls("counter", CHILD) == STEPS + 1
    # The parent's model was not asked again for the step whose tools were running.
    assert pair.model_calls("delegate", "root") == 2


async def test_child_finishing_while_parent_is_down_is_not_rerun(pair: Pair) -> None:
    async with await AgentClient.connect(pair.parent.address) as client:
        await client.start(INPUT, session_id="root")
        events = await _stream_until_child_step(client, 1)
        await pair.parent.kill()
        async with await AgentClient.connect(pair.child.address) as child_client:
            child_events = [e async for e in child_client.stream(CHILD)]  # wait for it to finish
        assert child_events[-1].WhichOneof("payload") == "completed"
        await pair.parent.start()
        events += [e async for e in client.stream("root", from_sequence=events[-1].sequence)]

    assert_parent_log_is_sound(events)
    assert pair.model_calls("counter", CHILD) == STEPS + 1


async def test_network_drop_between_parent_and_child(tmp_path: Path) -> None:
    child = _service("counter", tmp_path, port=free_port(), env={})
    proxy = TcpProxy(port=free_port(), target_port=child.port)
    parent = _service(
        "delegator", tmp_path, port=free_port(), env={"HELIX_AGENT_ADDRESS_COUNTER": proxy.address}
    )
    await asyncio.gather(child.start(), parent.start(), proxy.restore())
    try:
        async with await AgentClient.connect(parent.address) as client:
            await client.start(INPUT, session_id="root")
            events = await _stream_until_child_step(client, 2)
            assert proxy.connections == 1
            await proxy.drop()
            await asyncio.sleep(2.0)  # the child keeps running; the parent cannot reach it
            await proxy.restore()
            events += [e async for e in client.stream("root", from_sequence=events[-1].sequence)]
    finally:
        await proxy.drop()
        await asyncio.gather(parent.stop(), child.stop())

    assert_parent_log_is_sound(events)
    assert proxy.connections >= 2, "the parent never had to reconnect"
    lines = (tmp_path / "calls.log").read_text().splitlines()
    assert sum(1 for line in lines if line.split() == ["counter", CHILD]) == STEPS + 1


async def interrupt_while_the_child_is_down(
    tmp_path: Path,
    *,
    steps: int,
    outage_s: float,
    restart_parent: bool,
    reconnect_deadline_s: float | None = None,
) -> int:
    """Interrupt the root while its child's service is down for ``outage_s`` (the parent's
    process restarted meanwhile, with ``restart_parent``); once the child's service is
    back, the child must end interrupted. Returns the child's model calls."""
    child = _service("counter", tmp_path, port=free_port(), env={"HELIX_SCRIPTED_DELAY_MS": "50"})
    parent = _service(
        "delegator",
        tmp_path,
        port=free_port(),
        env={"HELIX_AGENT_ADDRESS_COUNTER": child.address},
        reconnect_deadline_s=reconnect_deadline_s,
    )
    long_input = json.dumps({"calls": [{"tool": "count", "args": {"steps": steps, "words": 2}}]})
    await asyncio.gather(child.start(), parent.start())
    try:
        async with await AgentClient.connect(parent.address) as client:
            await client.start(long_input, session_id="root")
            events = await _stream_until_child_step(client, 2)
            await child.kill()
            reply = await client.interrupt("root", reason="the user stopped it")
            assert reply.accepted
            rest = [e async for e in client.stream("root", from_sequence=events[-1].sequence)]
            assert rest[-1].WhichOneof("payload") == "interrupted"
            if restart_parent:  # the outbox is in the parent's store, not its memory
                await parent.kill()
            await asyncio.sleep(outage_s)  # the parent's service asks again meanwhile
            if restart_parent:
                await parent.start()
            await child.start()
        async with await AgentClient.connect(child.address) as child_client:
            async with asyncio.timeout(30):
                status = await child_client.wait(CHILD)
    finally:
        await asyncio.gather(parent.stop(), child.stop())
    assert status.status == pb.SESSION_STATUS_INTERRUPTED, status
    return sum(
        1 for line in (tmp_path / "calls.log").read_text().splitlines()
        if line.split() == ["counter", CHILD]
    )  # fmt: skip


async def test_a_child_whose_service_is_down_when_its_parent_is_interrupted_stops_when_back(
    tmp_path: Path,
) -> None:
    # A long child (20 slow steps): resumed after its service restarts, it would run on
    # for seconds for a parent that has ended, unless the cascade asks again.
    calls = await interrupt_while_the_child_is_down(
        tmp_path, steps=20, outage_s=1.0, restart_parent=False
    )
    assert calls < 21, "the child ran to its end"
