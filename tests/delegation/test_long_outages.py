"""Outages longer than the client's reconnect deadline (30 s): delegation never lies.

An unreachable child is not a failed child: the parent keeps reconnecting until the
child's service answers, and the root ends with the child's real output, the child
having run once. An interrupt sent while a child's service is down reaches the child
when it is back (the parent's outbox asks until it is taken).

Real processes on SQLite, SIGKILL and a TCP proxy that refuses connections. The
default run gives the parent a 3 s reconnect deadline (``serve --reconnect-deadline``)
and holds an outage of 6 s against it per test; the long ones (40 s and 90 s against
the 30 s default, a store outage under replicas) are opt-in with ``-m slow``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from helix_transport import AgentClient, ClientConfig, RetryConfig
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from tests.delegation.test_remote_crash import (
    CHILD,
    STEPS,
    _service,
    _stream_until_child_step,
    interrupt_while_the_child_is_down,
)
from tests.helpers import ROOT, ServiceProcess, TcpProxy, free_port
from tests.store.test_store_outage import RedisServer

RECONNECT_DEADLINE_S = 3.0
"""The parent's reconnect deadline in the default run (the default is 30 s)."""
SHORT_OUTAGE_S = 6.0
"""Past ``RECONNECT_DEADLINE_S``, with room for a loaded machine's slow restarts."""
DEFAULT_DEADLINE_OUTAGE_S = 35.0
"""Past the 30 s default reconnect deadline (``RetryConfig.deadline``)."""

LONG_INPUT = json.dumps({"calls": [{"tool": "count", "args": {"steps": STEPS, "words": 2}}]})


def _payloads(events: list[pb.StreamEvent]) -> list[str]:
    return [str(e.WhichOneof("payload")) for e in events]


def _assert_root_holds_the_real_answer(events: list[pb.StreamEvent]) -> None:
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    child = [e.child_event.event for e in events if e.WhichOneof("payload") == "child_event"]
    assert [e.sequence for e in child] == list(range(1, len(child) + 1)), "a child event lost"
    assert child[-1].WhichOneof("payload") == "completed"
    assert _payloads(events).count("subagent_start") == 1
    assert _payloads(events).count("subagent_end") == 1
    end = next(e.subagent_end for e in events if e.WhichOneof("payload") == "subagent_end")
    assert end.status == pb.SESSION_STATUS_COMPLETED, end.error
    assert events[-1].WhichOneof("payload") == "completed"
    assert json.loads(events[-1].completed.output_json) == {
        "results": [{"total": STEPS, "steps": STEPS}]
    }


def _calls(workdir: Path, agent: str, session_id: str) -> int:
    lines = (workdir / "calls.log").read_text().splitlines()
    return sum(1 for line in lines if line.split() == [agent, session_id])


async def _child_down_for(
    tmp_path: Path,
    outage_s: float,
    *,
    restart_parent: bool = False,
    reconnect_deadline_s: float | None = RECONNECT_DEADLINE_S,
) -> None:
    child = _service("counter", tmp_path, port=free_port(), env={"HELIX_SCRIPTED_DELAY_MS": "50"})
    parent = _service(
        "delegator",
        tmp_path,
        port=free_port(),
        env={"HELIX_AGENT_ADDRESS_COUNTER": child.address},
        reconnect_deadline_s=reconnect_deadline_s,
    )
    await asyncio.gather(child.start(), parent.start())
    try:
        async with await AgentClient.connect(parent.address) as client:
            await client.start(LONG_INPUT, session_id="root")
            events = await _stream_until_child_step(client, 2)
            await child.kill()
            if restart_parent:  # the resumed parent rejoins a child it cannot reach
                await parent.kill()
                await parent.start()
            await asyncio.sleep(outage_s)
            status = await client.get_status("root")
            assert status.status == pb.SESSION_STATUS_RUNNING, "the root ended without its child"
            await child.start()
            async with asyncio.timeout(60):
                events += [
                    e async for e in client.stream("root", from_sequence=events[-1].sequence)
                ]
    finally:
        await asyncio.gather(parent.stop(), child.stop())
    _assert_root_holds_the_real_answer(events)
    # Resumed once after the kill, never started over.
    assert STEPS + 1 <= _calls(tmp_path, "counter", CHILD) <= STEPS + 2


async def test_a_child_service_down_past_the_reconnect_deadline_is_waited_for(
    tmp_path: Path,
) -> None:
    await _child_down_for(tmp_path, SHORT_OUTAGE_S)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("outage_s", [40.0, 90.0])
async def test_a_child_service_down_for_long_is_waited_for(tmp_path: Path, outage_s: float) -> None:
    await _child_down_for(tmp_path, outage_s, reconnect_deadline_s=None)  # the 30 s default


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_parent_restarted_while_its_child_is_down_for_long_waits_for_it(
    tmp_path: Path,
) -> None:
    # Its rejoin asks the child's status first (is it suspended?): unanswered past the
    # client's deadline, that must not end the call.
    await _child_down_for(
        tmp_path, DEFAULT_DEADLINE_OUTAGE_S, restart_parent=True, reconnect_deadline_s=None
    )


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[AgentClient, TcpProxy]]:
    child = _service("counter", tmp_path, port=free_port(), env={"HELIX_SCRIPTED_DELAY_MS": "50"})
    proxy = TcpProxy(port=free_port(), target_port=child.port)
    parent = _service(
        "delegator", tmp_path, port=free_port(), env={"HELIX_AGENT_ADDRESS_COUNTER": proxy.address}
    )
    await asyncio.gather(child.start(), parent.start(), proxy.restore())
    try:
        async with await AgentClient.connect(parent.address) as client:
            yield client, proxy
    finally:
        await proxy.drop()
        await asyncio.gather(parent.stop(), child.stop())


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_connections_refused_for_45_s_lose_nothing(
    proxied: tuple[AgentClient, TcpProxy], tmp_path: Path
) -> None:
    client, proxy = proxied
    await client.start(LONG_INPUT, session_id="root")
    events = await _stream_until_child_step(client, 2)
    await proxy.drop()  # connections refused, open ones reset
    await asyncio.sleep(45.0)
    await proxy.restore()
    async with asyncio.timeout(60):
        events += [e async for e in client.stream("root", from_sequence=events[-1].sequence)]
    _assert_root_holds_the_real_answer(events)
    assert _calls(tmp_path, "counter", CHILD) == STEPS + 1


# The default run keeps the same guarantee shorter: test_interrupt_in_flight's child out of
# reach past the deadline, and test_abort's abort that reaches a child service when back.
@pytest.mark.slow
async def test_an_interrupt_sent_while_a_child_is_down_past_the_deadline_reaches_it(
    tmp_path: Path,
) -> None:
    calls = await interrupt_while_the_child_is_down(
        tmp_path,
        steps=50,
        outage_s=SHORT_OUTAGE_S,
        restart_parent=True,
        reconnect_deadline_s=RECONNECT_DEADLINE_S,
    )
    assert calls < 40, "the child ran on after its parent's interrupt"


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_the_shared_store_down_for_45_s_under_two_replicas_loses_nothing(
    tmp_path: Path,
) -> None:
    redis = RedisServer(tmp_path)  # persists (AOF), as a production store must
    await redis.start()
    store_url = f"redis://127.0.0.1:{redis.port}/0"

    def replica(agent: str, env: dict[str, str]) -> ServiceProcess:
        port = free_port()
        return ServiceProcess(
            f"tests.agents:{agent}",
            port=port,
            store_url=store_url,
            log_path=tmp_path / f"{agent}-{port}.log",
            env={
                "HELIX_SCRIPTED_DELAY_MS": "50",
                "HELIX_SCRIPTED_CALL_LOG": str(tmp_path / "calls.log"),
                **env,
            },
            extra_args=["--lease-ttl", "1", "--drain-timeout", "0.5"],
            cwd=ROOT,
        )

    children = [replica("counter", {}), replica("counter", {})]
    balanced = "ipv4:" + ",".join(c.address for c in children)
    parents = [replica("delegator", {"HELIX_AGENT_ADDRESS_COUNTER": balanced}) for _ in (1, 2)]
    services = [*children, *parents]
    await asyncio.gather(*(s.start() for s in services))
    patient = ClientConfig(reconnect=RetryConfig.default.until_cancelled())
    try:
        async with await AgentClient.connect(parents[0].address, config=patient) as client:
            await client.start(LONG_INPUT, session_id="root")
            events = await _stream_until_child_step(client, 2)
            await redis.kill()
            await asyncio.sleep(45.0)
            await redis.start()
            async with asyncio.timeout(120):
                events += [
                    e async for e in client.stream("root", from_sequence=events[-1].sequence)
                ]
    finally:
        await asyncio.gather(*(s.stop() for s in services))
        await redis.kill()
    _assert_root_holds_the_real_answer(events)
    assert STEPS + 1 <= _calls(tmp_path, "counter", CHILD) <= STEPS + 3
