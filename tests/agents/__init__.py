"""Agents used by the tests, importable by server subprocesses (tests.agents:NAME)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
    tool_results,
    user_input,
)
from helix_transport.delegation.remote import remote_agent_tool


class CountInput(BaseModel):
    steps: int = Field(default=3, ge=1, le=50)
    words: int = Field(default=4, ge=0, le=10_000)


class CountOutput(BaseModel):
    total: int
    steps: int


class TickArgs(BaseModel):
    n: int


@tool
async def tick(ctx: ToolContext, args: TickArgs) -> dict[str, int]:
    """Count one step."""
    return {"n": args.n, "step": ctx.step}


def _counter(messages: list[dict[str, object]]) -> ScriptedTurn:
    wanted = CountInput.model_validate(user_input(messages))
    done = steps_taken(messages)
    text = " ".join(f"w{done + 1}.{i}" for i in range(wanted.words))
    if done < wanted.steps:
        return ScriptedTurn(text=text + " ", tool_calls=(call("tick", n=done + 1),))
    last = tool_results(messages).get("tick", {})
    return finish(total=int(last.get("n", 0)) if isinstance(last, dict) else 0, steps=done)


counter = Agent(
    name="counter",
    description="Streams some words per step, ticks once per step, then reports the count.",
    input_model=CountInput,
    output_model=CountOutput,
    tools=[tick],
    model=register_script("counter", _counter),
    max_steps=60,
)
"""A deterministic multi-step agent; HELIX_SCRIPTED_DELAY_MS slows it down."""


def _never_finishes(messages: list[dict[str, object]]) -> ScriptedTurn:
    return ScriptedTurn(text="still thinking")


looper = Agent(
    name="looper",
    description="Never calls __finish__; fails on max_steps.",
    input_model=CountInput,
    output_model=CountOutput,
    model=register_script("looper", _never_finishes),
    max_steps=3,
)


def _bad_output_then_good(messages: list[dict[str, object]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return finish(total="not a number", steps=0)
    return finish(total=7, steps=steps_taken(messages))


fixer = Agent(
    name="fixer",
    description="Gives invalid output once, then valid output.",
    input_model=CountInput,
    output_model=CountOutput,
    model=register_script("fixer", _bad_output_then_good),
    max_steps=3,
)


# --- Delegation -------------------------------------------------------------------------
# Parents that call remote children through the mesh registry
# (HELIX_AGENT_ADDRESS_COUNTER, _LOOPER, _MIDDLE), so the same definitions serve
# in-process tests and server subprocesses.


class Delegation(BaseModel):
    tool: str
    args: dict[str, object] = Field(default_factory=dict)


class DelegateInput(BaseModel):
    calls: list[Delegation]


class DelegateOutput(BaseModel):
    results: list[object]


def _delegate(messages: list[dict[str, object]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        wanted = DelegateInput.model_validate(user_input(messages))
        return ScriptedTurn(
            text="Delegating. ",
            tool_calls=tuple(call(c.tool, **c.args) for c in wanted.calls),
        )
    return finish(results=[value for _, value in step_results(messages)])


def _delegating_agent(name: str) -> Agent:
    return Agent(
        name=name,
        description="Delegates the calls in its input to remote agents, in one step.",
        input_model=DelegateInput,
        output_model=DelegateOutput,
        tools=[
            remote_agent_tool("count", agent_type="counter", input_model=CountInput),
            remote_agent_tool("loop", agent_type="looper", input_model=CountInput),
            remote_agent_tool(
                "loop_briefly", agent_type="looper", input_model=CountInput, timeout_s=2
            ),
            remote_agent_tool("delegate", agent_type="middle", input_model=DelegateInput),
            remote_agent_tool(
                "count_quickly", agent_type="counter", input_model=CountInput, timeout_s=0.5
            ),
        ],
        model=register_script("delegate", _delegate),
        max_steps=4,
    )


delegator = _delegating_agent("delegator")
"""The root of a delegation tree."""

middle = _delegating_agent("middle")
"""The same, one level down (delegator -> middle -> counter is three levels)."""
