"""Scenario 11: what a deadline/budget check costs a step, beside the step itself.

A session with a deadline and a budget runs ``STEPS`` steps (a scripted model call
and one trivial tool each) on the memory store in this process; its time per step is
the baseline. The check is what the run loop adds to a step when limits are set: one
``LimitWatch.exceeded()`` (its usage plus its children's reported totals against the
budget, the clock against the deadline) and the deadline's timer on the step's race,
timed here in a loop over a watch with ``CHILDREN`` ended children. Target: under 2%.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel

from helix_transport._limits import SessionLimits
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.limits import LimitWatch
from helix_transport.agent.scripted import ScriptedToolCall, ScriptedTurn, finish, register_script
from helix_transport.agent.scripted import steps_taken as _steps
from helix_transport.agent.tools import ToolContext, tool
from helix_transport.bench._measure import Ids
from helix_transport.bench._report import Report, ratio_at_most
from helix_transport.server import ServerConfig
from helix_transport.server.app import create_server
from helix_transport.store import MemoryStore, Usage
from helix_transport.transport import AgentClient
from helix_transport.tree import ChildTotals, token_usage

STEPS = 50
CHILDREN = 8
CHECKS = 20_000


class _Empty(BaseModel):
    pass


class _Done(BaseModel):
    steps: int


@tool
async def _noop(ctx: ToolContext, args: _Empty) -> dict[str, int]:
    """Do nothing."""
    return {"step": ctx.step}


def _script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if _steps(messages) < STEPS:
        return ScriptedTurn(tool_calls=(ScriptedToolCall(name="_noop"),))
    return finish(steps=STEPS)


_AGENT = Agent(
    name="bench-limits",
    description="Takes many small steps.",
    input_model=_Empty,
    output_model=_Done,
    tools=[_noop],
    model=register_script("bench-limits", _script),
    max_steps=STEPS + 5,
)


def _check_cost_s() -> float:
    """Seconds one step's limit check takes (the check, and the timer it arms)."""
    children = ChildTotals()
    for n in range(CHILDREN):
        ended = pb.StreamEvent(
            session_id=f"child-{n}",
            sequence=1,
            completed=pb.Completed(total_usage=token_usage(Usage(total_tokens=10))),
        )
        children.note(ended)
    limits = SessionLimits.within(3600, budget_tokens=10**9, budget_usd=1000.0)
    watch = LimitWatch(limits, is_root=True, children=children)
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    for _ in range(CHECKS):
        watch.exceeded()
        timeout = watch.seconds_left()
        assert timeout is not None
        loop.call_later(timeout, _nothing).cancel()
    return (time.perf_counter() - started) / CHECKS


def _nothing() -> None:
    pass


async def limit_check(report: Report, ids: Ids, *, repeat: int) -> None:
    """Scenario 11: the check's cost as a share of a step, on the memory store."""
    step_s: list[float] = []
    async with (
        await create_server(
            _AGENT, MemoryStore(), ServerConfig(), allow_unauthenticated=True
        ) as server,
        await AgentClient.connect(server.address) as client,
    ):
        for _ in range(max(1, repeat)):
            session_id = ids("limits")
            limits = SessionLimits.within(3600, budget_tokens=10**9)
            started = time.perf_counter()
            await client.start("{}", session_id=session_id, limits=limits)
            async for event in client.stream(session_id):
                last = event
            step_s.append((time.perf_counter() - started) / (STEPS + 1))
            assert last.WhichOneof("payload") == "completed", last
    step = min(step_s)  # the fastest run: the check's share at its largest
    check = min(_check_cost_s() for _ in range(3))
    report.add(
        f"11 deadline/budget check per step ({CHILDREN} children)",
        "memory, in-process",
        "ms",
        check * 1000,
        step * 1000,
        "one step of the same session (model call, tool, checkpoint)",
        ratio_at_most(0.02),
    )
