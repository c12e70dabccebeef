"""An agent with a ``once`` tool and an ordinary one, for crash tests across processes.

Importable by server subprocesses (``tests.agents.once:payer``). In its first step the
model calls both tools at once: ``pay`` (``once=True``) and ``note`` (an ordinary tool);
then it finishes with their results. Each tool records every time it really runs, one
JSON line in the file ``HELIX_TEST_RUNS_LOG`` names, before it does anything else: a
test reads that file to know a tool is running (and to count runs across processes and
crashes). The run's input names the tool that blocks on its first run in the session
(``{"block": "pay"}``), so a test can SIGKILL the service while it runs; on a later run
it returns at once.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)

RUNS_LOG = "HELIX_TEST_RUNS_LOG"


class Order(BaseModel):
    block: Literal["pay", "note", ""] = ""
    """The tool that blocks on its first run."""


class Args(BaseModel):
    block: bool = False


class Outcome(BaseModel):
    result: Any = None


def runs(path: Path, session_id: str, tool_name: str) -> list[dict[str, Any]]:
    """The runs ``tool_name`` made in ``session_id``, as the log file has them."""
    lines = path.read_text().splitlines() if path.exists() else []
    found = [json.loads(line) for line in lines]
    return [r for r in found if r["session_id"] == session_id and r["tool"] == tool_name]


async def _run(ctx: ToolContext, tool_name: str, block: bool) -> dict[str, Any]:
    path = Path(os.environ[RUNS_LOG])
    first = not runs(path, ctx.session_id, tool_name)
    line = {
        "session_id": ctx.session_id,
        "tool": tool_name,
        "call": ctx.tool_call_id,
        "key": ctx.idempotency_key,
    }
    with path.open("a", encoding="utf-8") as log:  # noqa: ASYNC230  (tests: one line)
        log.write(json.dumps(line) + "\n")
    if block and first:
        await asyncio.sleep(3600)  # until the test kills the process
    return {"tool": tool_name, "key": ctx.idempotency_key}


@tool(once=True)
async def pay(ctx: ToolContext, args: Args) -> dict[str, Any]:
    """Pay (an effect that must not happen twice)."""
    return await _run(ctx, "pay", args.block)


@tool
async def note(ctx: ToolContext, args: Args) -> dict[str, Any]:
    """Write a note (safe to repeat)."""
    return await _run(ctx, "note", args.block)


def _script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        block = user_input(messages).get("block", "")
        return ScriptedTurn(
            tool_calls=(
                ScriptedToolCall(name="pay", arguments={"block": block == "pay"}, id="call_pay"),
                ScriptedToolCall(name="note", arguments={"block": block == "note"}, id="call_note"),
            )
        )
    return finish(result=dict(step_results(messages)))


payer = Agent(
    name="once-payer",
    description="Pays once and writes a note, concurrently.",
    input_model=Order,
    output_model=Outcome,
    tools=[pay, note],
    model=register_script("once-payer", _script),
)
