"""The checks of ``StartRequest.limits`` (capability ``limits``): invalid limits refused
naming the field, with no session created; valid ones kept and reported by ``GetStatus``."""

from __future__ import annotations

import time

import grpc

from helix_transport._limits import SessionLimits
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.testing.conformance._contract import LIMITS, require
from helix_transport.testing.conformance._kit import Kit


async def check_limits(kit: Kit) -> None:
    await kit.check("limits.invalid", lambda: _invalid(kit))
    await kit.check("limits.kept", lambda: _kept(kit))


async def _invalid(kit: Kit) -> str:
    kit.require_capability(LIMITS)
    past = pb.SessionLimits()
    past.deadline.FromSeconds(int(time.time()) - 3600)
    cases = (
        ("limits.deadline", past),
        ("limits.budget_tokens", pb.SessionLimits(budget_tokens=-1)),
        ("limits.budget_usd", pb.SessionLimits(budget_usd=-0.5)),
    )
    shown = []
    for field, limits in cases:
        session_id = f"{kit.prefix}-bad-{field.rsplit('.', 1)[-1]}"
        request = pb.StartRequest(session_id=session_id, input_json=kit.input_json, limits=limits)
        call = kit.stub.Start(request, timeout=kit.rpc_timeout_s)
        await kit.expect_error(grpc.StatusCode.INVALID_ARGUMENT, call, field=field)
        await kit.expect_error(grpc.StatusCode.NOT_FOUND, kit.status(session_id))
        shown.append(field)
    return f"INVALID_ARGUMENT naming {', '.join(shown)}; no session created"


async def _kept(kit: Kit) -> str:
    kit.require_capability(LIMITS)
    given = SessionLimits.within(3600, budget_tokens=10**9, budget_usd=1000.0)
    session_id = f"{kit.prefix}-limits"
    request = pb.StartRequest(
        session_id=session_id, input_json=kit.input_json, limits=given.to_proto()
    )
    await kit.stub.Start(request, timeout=kit.rpc_timeout_s)
    reported = (await kit.status(session_id)).limits
    require(
        reported.budget_tokens == 10**9 and reported.budget_usd == 1000.0,
        f"GetStatus.limits does not report the budget Start set: {reported}",
    )
    deadline_s = reported.deadline.ToNanoseconds() / 1e9
    require(
        given.deadline is not None and abs(deadline_s - given.deadline) < 0.001,
        f"GetStatus.limits.deadline is {deadline_s}, Start set {given.deadline}",
    )
    await kit.interrupt(session_id)  # not needed any more
    return "GetStatus.limits reports the deadline and budget Start set"
