"""What ``@tool(once=True)`` costs per call, beside an ordinary tool in the same run.

    python -m helix_transport.bench.once [--stores memory,sqlite,redis,postgres] [--steps 200]

One session per store runs ``--steps`` steps, one tool call each, alternating an
ordinary tool and a ``once`` tool with the same empty body. A step's time is from its
call's start to the next step's call's start: the checkpoint before the tools, the
call, the step's checkpoint and the next model call (the scripted model, no delay). A
``once`` call's start record rides the checkpoint taken before the tools (no write of
its own); its result is one more fenced append (``tool_end`` flushed before the call is
done). Prints the median step of each kind, their difference (the cost of that append
per call) and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NoHooks
from helix_transport.agent.loop import RunLoop
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    steps_taken,
)
from helix_transport.agent.tools import ToolContext, tool
from helix_transport.bench.streams import STORES, bench_store
from helix_transport.log import EventHub, SessionWriter
from helix_transport.store import SessionRecord, Store
from helix_transport.transport import ClientPool


class _Args(BaseModel):
    pass


class _Done(BaseModel):
    steps: int = 0


@tool
async def plain(ctx: ToolContext, args: _Args) -> dict[str, bool]:
    """An ordinary tool: at least once."""
    return {"ok": True}


@tool(once=True)
async def once(ctx: ToolContext, args: _Args) -> dict[str, bool]:
    """A ``once`` tool: at most once."""
    return {"ok": True}


def _agent(steps: int) -> Agent:
    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        taken = steps_taken(messages)
        if taken >= steps:
            return finish(steps=taken)
        return ScriptedTurn(tool_calls=(ScriptedToolCall(name=("plain", "once")[taken % 2]),))

    return Agent(
        name="bench-once",
        description="Alternates an ordinary tool and a once tool.",
        input_model=_Args,
        output_model=_Done,
        tools=[plain, once],
        model=register_script(f"bench-once-{steps}", script),
        max_steps=steps + 1,
    )


class _StepClock(NoHooks):
    """When each call started, and the tool's name."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, float]] = []

    def on_tool_start(self, *, name: str, tool_call_id: str, arguments_json: str) -> None:
        self.starts.append((name, time.perf_counter()))


async def _measure(store: Store, name: str, steps: int) -> None:
    agent = _agent(steps)
    session_id = f"bench-once-{time.time_ns()}"
    record = SessionRecord(
        session_id=session_id, agent_type=agent.name, input_json="{}", input_hash=""
    )
    await store.create_session(record)
    writer = SessionWriter(
        store, EventHub(), session_id=session_id, agent_type=agent.name, last_sequence=0
    )
    clock = _StepClock()
    loop = RunLoop(
        agent,
        record,
        store=store,
        writer=writer,
        interrupt_signal=asyncio.Event(),
        clients=ClientPool(),
        hooks=clock,
    )
    await loop.run()
    by_kind: dict[str, list[float]] = {"plain": [], "once": []}
    for (kind, at), (_, following) in zip(clock.starts, clock.starts[1:], strict=False):
        if kind in by_kind:
            by_kind[kind].append(following - at)
    p, o = (statistics.median(by_kind[k][2:]) * 1000 for k in ("plain", "once"))  # warm
    print(
        f"{name:9} {steps} steps: ordinary {p:6.2f} ms/step, once {o:6.2f} ms/step,"
        f" +{o - p:5.2f} ms per once call, {o / p:4.2f}x"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="helix-bench-once-") as tmp:
        for name in args.stores.split(","):
            async with bench_store(name, Path(tmp)) as store:
                await _measure(store, name, args.steps)


if __name__ == "__main__":
    asyncio.run(main())
