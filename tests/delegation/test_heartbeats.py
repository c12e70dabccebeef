"""Heartbeats on a quiet ``Stream`` (``StreamResponse.heartbeat``, not logged), read off
the wire with the generated stub so each one's arrival time and content are seen.

- Cadence: a stream quiet for longer than the interval gets one heartbeat per
  interval, never more often, none while events flow.
- A parked dispatch run: the parent waiting for its ``run_subagent`` batch says how
  many sub-agents it waits for.
- A suspended stream: a session waiting for an approval says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc
import pytest

from helix_transport import AgentClient, ServerConfig, create_server
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc
from helix_transport.registry import address_env_var
from helix_transport.store import MemoryStore
from tests.agents.approvals import mailer
from tests.agents.subagents import delegator, notetaker, sleeper

INTERVAL_S = 0.3


@pytest.fixture
async def addresses(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, str]]:
    """A service per agent in this process, heartbeats every ``INTERVAL_S``."""
    config = ServerConfig(port=0, heartbeat_interval_s=INTERVAL_S)
    async with AsyncExitStack() as stack:
        found = {}
        for agent in (notetaker, sleeper, delegator, mailer):
            server = await stack.enter_async_context(
                await create_server(agent, MemoryStore(), config, allow_unauthenticated=True)
            )
            monkeypatch.setenv(address_env_var(agent.name), server.address)
            found[agent.name] = server.address
        yield found


async def wire(
    address: str, session_id: str, *, until_s: float
) -> list[tuple[float, pb.StreamResponse]]:
    """Every ``StreamResponse`` of ``session_id`` with its arrival time, to the end of
    the stream or ``until_s`` seconds."""
    got: list[tuple[float, pb.StreamResponse]] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        call = stub.Stream(pb.StreamRequest(session_id=session_id), timeout=until_s)
        try:
            async for response in call:
                got.append((time.monotonic(), response))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    return got


def beats(got: list[tuple[float, pb.StreamResponse]]) -> list[tuple[float, pb.Heartbeat]]:
    return [(at, r.heartbeat) for at, r in got if r.HasField("heartbeat")]


def check_cadence(got: list[tuple[float, pb.StreamResponse]]) -> None:
    """Each heartbeat follows the last response by about one interval: never sooner
    (a busy stream pays nothing), and never much later (the connection stays warm)."""
    previous = got[0][0]
    for at, response in got[1:]:
        if response.HasField("heartbeat"):
            assert at - previous >= INTERVAL_S * 0.8, at - previous
            assert at - previous <= INTERVAL_S * 4, at - previous  # a loaded 2-core machine
        previous = at


async def test_a_parked_dispatch_run_beats_with_its_pending_children(
    addresses: dict[str, str],
) -> None:
    async with await AgentClient.connect(addresses["delegator"]) as client:
        await client.start(json.dumps({"goal": "nap pear"}), session_id="park")
    got = await wire(addresses["delegator"], "park", until_s=20)

    events = [e for _, r in got for e in r.events]
    assert events[-1].WhichOneof("payload") == "completed", events[-1]
    heartbeats = beats(got)
    # The sleeper's one model call is silent for 1.5 s: the parked parent beats meanwhile.
    waiting = [h for _, h in heartbeats if h.pending_children]
    assert len(waiting) >= 2, got
    assert {h.detail for h in waiting} == {"waiting for 1 sub-agent(s)"}
    # Any other beat is the parent's own work (its model calls around the wait).
    assert {h.detail for _, h in heartbeats if not h.pending_children} <= {"working"}
    assert all(not r.events for _, r in got if r.HasField("heartbeat"))  # never in the log
    check_cadence(got)


async def test_a_suspended_stream_beats_saying_it_waits_for_input(
    addresses: dict[str, str],
) -> None:
    async with await AgentClient.connect(addresses["hitl-mailer"]) as client:
        await client.start(json.dumps({"to": "a@example.com"}), session_id="held")
    got = await wire(addresses["hitl-mailer"], "held", until_s=2.0)

    kinds = [e.WhichOneof("payload") for _, r in got for e in r.events]
    assert "suspended" in kinds and "completed" not in kinds
    heartbeats = beats(got)
    # Quiet for about 2 s after its suspension: about one beat per interval.
    assert len(heartbeats) >= 3, got
    assert {(h.detail, h.pending_children) for _, h in heartbeats} == {
        ("suspended: waiting for input", 0)
    }
    check_cadence(got)
