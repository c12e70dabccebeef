"""The benchmark's agents, importable by service subprocesses
(``helix_transport.bench.agents:leaf``, ``helix_transport.bench.agents:parent``).

``leaf`` (agent type ``bench-leaf``) is the child and the streaming agent: in mode
``once`` its scripted model finishes on its first turn (one step, no tool); in
mode ``emit`` it first calls ``emit_events``, which emits ``n`` text deltas (as fast
as the runtime takes them, or one every ``pace_ms``), then finishes.

``parent`` (agent type ``bench-parent``) makes ``count`` calls of one tool in ONE
step, concurrently, then finishes with how many succeeded:

- ``child``: the remote ``bench-leaf`` service (``HELIX_AGENT_ADDRESS_BENCH_LEAF``);
- ``local``: the same child's work run directly inside the parent's tool call (the
  leaf's scripted model through litellm, its tools, its output validation), with no
  child session, no child log and no gRPC: the baseline for delegation overhead.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.litellm import stream_completion
from helix_transport.agent.loop import FINISH_INSTRUCTIONS
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)
from helix_transport.agent.tools import FINISH_TOOL, ToolError, dump_result
from helix_transport.delegation.remote import remote_agent_tool

# ---------------------------------------------------------------- the child


class LeafInput(BaseModel):
    """What the leaf does."""

    mode: str = "once"
    """``once`` (finish on the first turn) or ``emit`` (emit ``n`` events, then finish)."""
    n: int = Field(default=0, ge=0, le=1_000_000)
    pace_ms: float = Field(default=0, ge=0, le=10_000)
    """Pause between two emitted events; 0 emits as fast as the runtime takes them."""


class LeafOutput(BaseModel):
    """How many events the leaf was asked to emit."""

    events: int


class EmitArgs(BaseModel):
    """Arguments of ``emit_events``."""

    n: int
    pace_ms: float = 0


@tool
async def emit_events(ctx: ToolContext, args: EmitArgs) -> dict[str, int]:
    """Emit ``n`` one-character text deltas, one every ``pace_ms`` or back to back."""
    for i in range(args.n):
        ctx.emit(pb.StreamEvent(text_delta=pb.TextDelta(text="x")))
        if args.pace_ms:
            await asyncio.sleep(args.pace_ms / 1000)
        elif i % 100 == 99:
            await asyncio.sleep(0)  # let readers and the writer in
    return {"emitted": args.n}


def _leaf(messages: list[dict[str, Any]]) -> ScriptedTurn:
    request = LeafInput.model_validate(user_input(messages))
    if steps_taken(messages) > 0 or request.mode == "once":
        return finish(events=request.n)
    return ScriptedTurn(tool_calls=(call("emit_events", n=request.n, pace_ms=request.pace_ms),))


leaf = Agent(
    name="bench-leaf",
    description="A child whose scripted model finishes at once, or after emitting n events.",
    input_model=LeafInput,
    output_model=LeafOutput,
    tools=[emit_events],
    model=register_script("bench-leaf", _leaf),
    max_steps=3,
)

# ---------------------------------------------------------------- the in-process baseline


@tool
async def local(ctx: ToolContext, args: LeafInput) -> Any:
    """Do the leaf's work right here: its model turns, its tools, its output validation."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": FINISH_INSTRUCTIONS},
        {"role": "user", "content": args.model_dump_json()},
    ]
    for _ in range(leaf.max_steps):
        response = await stream_completion(
            model=leaf.resolved_model(),
            messages=messages,
            tools=leaf.tool_schemas(),
            on_text=lambda text: ctx.emit(pb.StreamEvent(text_delta=pb.TextDelta(text=text))),
        )
        messages.append(response.to_message())
        for tool_call in response.tool_calls:
            if tool_call.name == FINISH_TOOL:
                return leaf.output_model.model_validate_json(tool_call.arguments_json).model_dump()
            child_tool = leaf.tool(tool_call.name)
            if child_tool is None:
                raise ToolError(f"no tool {tool_call.name}")
            result = await child_tool.fn(ctx, child_tool.parse_args(tool_call.arguments_json))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": tool_call.id,
                    "name": tool_call.name,
                    "content": dump_result(result),
                }
            )
    raise ToolError("the leaf did not finish")


# ---------------------------------------------------------------- the parent


class ParentInput(BaseModel):
    """What the parent delegates."""

    tool: str = "child"
    """``child`` (remote) or ``local``."""
    count: int = Field(default=1, ge=1, le=10_000)
    args: LeafInput = Field(default_factory=LeafInput)


class ParentOutput(BaseModel):
    """How many of the parent's calls succeeded, and the first errors."""

    ok: int
    errors: list[str]


def _parent(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        request = ParentInput.model_validate(user_input(messages))
        arguments = request.args.model_dump()
        return ScriptedTurn(
            tool_calls=tuple(call(request.tool, **arguments) for _ in range(request.count))
        )
    errors = [
        str(value["error"])
        for _, value in step_results(messages)
        if isinstance(value, dict) and "error" in value
    ]
    results = step_results(messages)
    return finish(ok=len(results) - len(errors), errors=errors[:5])


parent = Agent(
    name="bench-parent",
    description="Calls one tool `count` times in one step (remote child or local baseline).",
    input_model=ParentInput,
    output_model=ParentOutput,
    tools=[
        remote_agent_tool("child", agent_type="bench-leaf", input_model=LeafInput),
        local,
    ],
    model=register_script("bench-parent", _parent),
    max_steps=3,
    max_live_children=0,  # scenario 5 fans out to --children (1,000) leaves at once
)


def parent_input(
    tool_name: str, *, count: int = 1, mode: str = "once", n: int = 0, pace_ms: float = 0
) -> str:
    """The parent's input JSON."""
    args = {"mode": mode, "n": n, "pace_ms": pace_ms}
    return json.dumps({"tool": tool_name, "count": count, "args": args})


def leaf_input(*, mode: str = "once", n: int = 0, pace_ms: float = 0) -> str:
    """The leaf's input JSON."""
    return LeafInput(mode=mode, n=n, pace_ms=pace_ms).model_dump_json()


# ---------------------------------------------------------------- the root (three levels)


class RootInput(BaseModel):
    """What the root delegates to ``bench-parent``."""

    args: ParentInput = Field(default_factory=ParentInput)


def _root(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        request = RootInput.model_validate(user_input(messages))
        return ScriptedTurn(tool_calls=(call("parent", **request.args.model_dump()),))
    ok = sum(1 for _, value in step_results(messages) if not _is_error(value))
    return finish(ok=ok, errors=[])


def _is_error(value: Any) -> bool:
    return isinstance(value, dict) and "error" in value


root = Agent(
    name="bench-root",
    description="Delegates to bench-parent, which delegates to bench-leaf: three levels.",
    input_model=RootInput,
    output_model=ParentOutput,
    tools=[remote_agent_tool("parent", agent_type="bench-parent", input_model=ParentInput)],
    model=register_script("bench-root", _root),
    max_steps=3,
)


def root_input(*, mode: str = "emit", n: int = 0, pace_ms: float = 0) -> str:
    """The root's input JSON: one parent call of one leaf call."""
    return json.dumps({"args": json.loads(parent_input("child", mode=mode, n=n, pace_ms=pace_ms))})
