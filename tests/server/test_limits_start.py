"""``StartRequest.limits`` at the door: the call's gRPC deadline when none is given,
exactly what is given otherwise, and INVALID_ARGUMENT naming each bad field."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from helix_transport import AgentClient, SessionLimits
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._proto.helix.agent.v1 import agent_pb2_grpc as pb_grpc
from helix_transport.server import create_server
from helix_transport.store import MemoryStore
from tests.agents import counter

INPUT = json.dumps({"steps": 1, "words": 1})


async def test_a_grpc_deadline_is_the_deadline_only_without_limits() -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        grpc.aio.insecure_channel(server.address) as channel,
        await AgentClient.connect(server.address) as client,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        before = time.time()
        await stub.Start(pb.StartRequest(session_id="raw", input_json=INPUT), timeout=30)
        raw = (await client.get_status("raw")).limits
        # limits present but empty: no deadline, whatever the call's own deadline.
        empty = pb.StartRequest(session_id="empty", input_json=INPUT, limits=pb.SessionLimits())
        await stub.Start(empty, timeout=30)
        await client.start(INPUT, session_id="client")  # AgentClient always sends limits
        given = SessionLimits.within(600, budget_tokens=0)
        await client.start(INPUT, session_id="given", limits=given)
        statuses = {s: await client.get_status(s) for s in ("empty", "client", "given")}
    # The call's 30 s, less however long the Start took to arrive (seconds on a loaded host).
    assert before + 20 < raw.deadline.ToNanoseconds() / 1e9 <= time.time() + 30
    assert not raw.HasField("budget_tokens")
    for name in ("empty", "client"):
        assert statuses[name].limits == pb.SessionLimits(), name
    assert statuses["given"].limits == given.to_proto()


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        (pb.SessionLimits(budget_tokens=-1), "limits.budget_tokens"),
        (pb.SessionLimits(budget_usd=-0.01), "limits.budget_usd"),
        (pb.SessionLimits(budget_usd=float("nan")), "limits.budget_usd"),
        (SessionLimits(deadline=time.time() - 1).to_proto(), "limits.deadline"),
    ],
)
async def test_bad_limits_are_invalid_argument_naming_the_field(
    limits: pb.SessionLimits, field: str
) -> None:
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        request = pb.StartRequest(session_id="bad", input_json=INPUT, limits=limits)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Start(request, timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (raised.value.details() or "")


async def test_a_malformed_deadline_is_invalid_argument() -> None:
    limits = pb.SessionLimits()
    limits.deadline.seconds, limits.deadline.nanos = int(time.time()) + 60, 2_000_000_000
    async with (
        await create_server(counter, MemoryStore(), allow_unauthenticated=True) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        request = pb.StartRequest(session_id="bad", input_json=INPUT, limits=limits)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Start(request, timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limits.deadline: not a valid timestamp" in (raised.value.details() or "")
