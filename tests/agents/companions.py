"""Parents with persistent children, importable by server subprocesses.

Children are found through the mesh registry (HELIX_AGENT_ADDRESS_CRITIC,
_RESEARCHER, _COUNTER), so the same definitions serve in-process tests and
service processes.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)
from helix_transport.delegation.companions import PersistentChild, with_companions
from helix_transport.delegation.dispatch import SubagentType, with_dispatch

NOTICE = "[sub-agent notifications]"


def notices(messages: list[dict[str, Any]]) -> list[str]:
    """Every notification line the parent's model has been shown."""
    return [
        line
        for m in messages
        if m.get("role") == "user" and str(m.get("content", "")).startswith(NOTICE)
        for line in str(m["content"]).splitlines()[1:]
    ]


# --- maker / critic -------------------------------------------------------------------


class MakerInput(BaseModel):
    drafts: list[str] = Field(min_length=1)


class MakerOutput(BaseModel):
    verdicts: list[dict[str, Any]]


def _maker(messages: list[dict[str, Any]]) -> ScriptedTurn:
    drafts = MakerInput.model_validate(user_input(messages)).drafts
    verdicts = [
        value for m in messages if m.get("role") == "tool"
        for value in [json.loads(str(m["content"]))]
        if isinstance(value, dict) and "output" in value
    ]  # fmt: skip
    done = len(verdicts)
    passed = bool(verdicts) and verdicts[-1]["output"]["verdict"] == "pass"
    if done < len(drafts) and not passed:
        spawn = ScriptedToolCall(
            name="companion__spawn_agent",
            arguments={"agent": "critic", "name": "reviewer", "message": drafts[done]},
        )
        return ScriptedTurn(text=f"Round {done + 1}. ", tool_calls=(spawn,))
    return finish(verdicts=[v["output"] for v in verdicts])


maker = with_companions(
    Agent(
        name="maker",
        description="Writes drafts and re-consults the same critic until it passes.",
        input_model=MakerInput,
        output_model=MakerOutput,
        model=register_script("maker", _maker),
        max_steps=8,
    ),
    [PersistentChild(agent_type="critic", mode="blocking", input_field="artifact")],
)


# --- a parent that plays a plan of companion calls, one step per entry ------------------


class Call(BaseModel):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)


class Plan(BaseModel):
    steps: list[list[Call]]


class PlanOutput(BaseModel):
    results: list[list[Any]]
    notices: list[str]


def _planner(messages: list[dict[str, Any]]) -> ScriptedTurn:
    plan = Plan.model_validate(user_input(messages))
    done = steps_taken(messages)
    if done < len(plan.steps):
        return ScriptedTurn(
            tool_calls=tuple(
                ScriptedToolCall(name=c.tool, arguments=c.args) for c in plan.steps[done]
            )
        )
    results: list[list[Any]] = []
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            results.append(step_results(messages[: _step_end(messages, index)]))
    return finish(results=[[v for _, v in r] for r in results], notices=notices(messages))


def _step_end(messages: list[dict[str, Any]], assistant: int) -> int:
    end = assistant + 1
    while end < len(messages) and messages[end].get("role") == "tool":
        end += 1
    return end


planner = with_companions(
    Agent(
        name="planner",
        description="Plays a plan of companion tool calls, one step per entry.",
        input_model=Plan,
        output_model=PlanOutput,
        model=register_script("planner", _planner),
        max_steps=12,
    ),
    [
        PersistentChild(agent_type="critic", mode="blocking", input_field="artifact"),
        PersistentChild(agent_type="counter", mode="non-blocking", input_field=None),
    ],
)


# --- non-blocking researchers, results pushed at the next step -------------------------


class PauseArgs(BaseModel):
    seconds: float = Field(gt=0, le=5)


@tool
async def pause(ctx: ToolContext, args: PauseArgs) -> dict[str, float]:
    """Do other work for a while."""
    await asyncio.sleep(args.seconds)
    return {"paused": args.seconds}


class HoldArgs(BaseModel):
    path: str


@tool
async def hold(ctx: ToolContext, args: HoldArgs) -> dict[str, str]:
    """Wait until the file ``path`` exists (a test's go-ahead)."""
    while not await asyncio.to_thread(os.path.exists, args.path):  # noqa: ASYNC110 (a file)
        await asyncio.sleep(0.05)
    return {"held": args.path}


class LeadInput(BaseModel):
    topics: list[str] = Field(min_length=1)
    hold: list[str] = Field(default_factory=list)
    """Files to wait for: once right after spawning, once after the notices arrived."""


class LeadOutput(BaseModel):
    notices: list[str]
    spawned: list[Any]


def _lead(messages: list[dict[str, Any]]) -> ScriptedTurn:
    wanted = LeadInput.model_validate(user_input(messages))
    if steps_taken(messages) == 0:
        spawns = tuple(
            call("companion__spawn_agent", agent="researcher", message=topic)
            for topic in wanted.topics
        )
        return ScriptedTurn(text="Spawning researchers. ", tool_calls=spawns)
    seen = notices(messages)
    holds = sum(1 for m in messages if m.get("role") == "tool" and m.get("name") == "hold")
    if wanted.hold and holds == 0:
        return ScriptedTurn(tool_calls=(call("hold", path=wanted.hold[0]),))
    if len(seen) < len(wanted.topics):
        return ScriptedTurn(text="Still waiting. ", tool_calls=(call("pause", seconds=0.1),))
    if holds < len(wanted.hold):
        return ScriptedTurn(tool_calls=(call("hold", path=wanted.hold[holds]),))
    spawned = [
        json.loads(str(m["content"])) for m in messages
        if m.get("role") == "tool" and m.get("name") == "companion__spawn_agent"
    ]  # fmt: skip
    return finish(notices=seen, spawned=spawned)


lead = with_companions(
    Agent(
        name="lead",
        description="Spawns researchers in the background and reports what they found.",
        input_model=LeadInput,
        output_model=LeadOutput,
        tools=[pause, hold],
        model=register_script("lead", _lead),
        max_steps=60,
    ),
    [PersistentChild(agent_type="researcher", mode="non-blocking", input_field="topic")],
)


# --- run_subagent: non-blocking dispatch, batched results, a run deadline -------------

RESULTS = "[sub-agent results"


class CoordinatorInput(BaseModel):
    topics: list[str] = Field(min_length=1)


class CoordinatorOutput(BaseModel):
    results: list[Any]
    batches: int
    heading: str


def _coordinator(messages: list[dict[str, Any]]) -> ScriptedTurn:
    wanted = CoordinatorInput.model_validate(user_input(messages))
    batches = [
        str(m["content"]) for m in messages
        if m.get("role") == "user" and str(m.get("content", "")).startswith(RESULTS)
    ]  # fmt: skip
    done = steps_taken(messages)
    if done == 0:
        tasks = [{"agent": "researcher", "message": topic} for topic in wanted.topics]
        return ScriptedTurn(
            text="Dispatching. ",
            tool_calls=(ScriptedToolCall(name="run_subagent", arguments={"tasks": tasks}),),
        )
    if batches:
        heading, _, body = batches[-1].partition("\n")
        return finish(
            results=json.loads(body.split("\n")[0]), batches=len(batches), heading=heading
        )
    if done == 1:  # the pass goes on while the researchers work
        return ScriptedTurn(
            text="Meanwhile, other work. ", tool_calls=(call("pause", seconds=0.05),)
        )
    return ScriptedTurn(text="Waiting for the researchers.")  # the pass ends: the run parks


def _coordinating_agent(name: str, deadline_s: float | None) -> Agent:
    return with_dispatch(
        Agent(
            name=name,
            description="Dispatches research tasks and reports the batch of results.",
            input_model=CoordinatorInput,
            output_model=CoordinatorOutput,
            tools=[pause],
            model=register_script(name, _coordinator),
            max_steps=8,
        ),
        [SubagentType(agent_type="researcher", input_field="topic")],
        run_deadline_s=deadline_s,
    )


coordinator = _coordinating_agent("coordinator", None)
hasty = _coordinating_agent("hasty", 2.0)
"""The same with a 2-second run deadline."""


def _never_answering(
    name: str, *, pause_s: float, max_steps: int, deadline_s: float | None, description: str
) -> Agent:
    """Dispatches one research task, then pauses step after step and never answers."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            tasks = [{"agent": "researcher", "message": "event sourcing"}]
            return ScriptedTurn(
                tool_calls=(ScriptedToolCall(name="run_subagent", arguments={"tasks": tasks}),)
            )
        return ScriptedTurn(tool_calls=(call("pause", seconds=pause_s),))

    return with_dispatch(
        Agent(
            name=name,
            description=description,
            input_model=CoordinatorInput,
            output_model=CoordinatorOutput,
            tools=[pause],
            model=register_script(name, script),
            max_steps=max_steps,
        ),
        [SubagentType(agent_type="researcher", input_field="topic")],
        run_deadline_s=deadline_s,
    )


stubborn = _never_answering(
    "stubborn",
    pause_s=0.2,
    max_steps=50,
    deadline_s=1.0,
    description="Dispatches, then ignores its deadline.",
)
"""Keeps working past its deadline's last pass: the run fails with ``deadline``."""

quitter = _never_answering(
    "quitter",
    pause_s=0.01,
    max_steps=3,
    deadline_s=None,
    description="Dispatches, then runs out of steps while its task is out.",
)
"""Fails (``max_steps``) while the researcher it dispatched is still running."""


# --- a queue handed over to a running critic --------------------------------------------


class RelayInput(BaseModel):
    drafts: list[str] = Field(min_length=2)
    """The first starts the critic; the rest are sent while it reviews the first."""


class RelayOutput(BaseModel):
    notices: list[str]


def _relay(messages: list[dict[str, Any]]) -> ScriptedTurn:
    drafts = RelayInput.model_validate(user_input(messages)).drafts
    done = steps_taken(messages)
    if done == 0:
        spawn = {"agent": "critic", "message": drafts[0], "name": "critic"}
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="companion__spawn_agent", arguments=spawn),)
        )
    if done < len(drafts):
        send = {"name": "critic", "message": drafts[done]}
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="companion__send_message", arguments=send),)
        )
    seen = notices(messages)
    if sum("completed with result" in line for line in seen) == 2:
        return finish(notices=seen)
    return ScriptedTurn(tool_calls=(call("pause", seconds=0.05),))


relay = with_companions(
    Agent(
        name="relay",
        description="Starts a critic, sends it more drafts while it works, waits for both rounds.",
        input_model=RelayInput,
        output_model=RelayOutput,
        tools=[pause],
        model=register_script("relay", _relay),
        max_steps=80,
    ),
    [PersistentChild(agent_type="critic", mode="non-blocking", input_field="artifact")],
)
