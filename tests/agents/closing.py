"""Parents that finish while their ``run_subagent`` task is out, one per close policy,
and the ``holder`` child they dispatch to (it runs until a go-ahead file exists);
importable by server subprocesses (children found through HELIX_AGENT_ADDRESS_HOLDER,
_CRITIC).

With ``HELIX_TEST_FINISH_MARK`` set, a parent's first ``__finish__`` writes that file
and hangs there, until the test SIGKILLs its service (the moment of finishing); the
run resumed afterwards finds ``<mark>.done`` and goes on.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ClosePolicy, ToolContext
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
    user_input,
)
from helix_transport.delegation.companions import PersistentChild, with_companions
from helix_transport.delegation.dispatch import SubagentType, with_dispatch
from tests.agents.companions import hold

HELD = "[sub-agent results before finishing]"


class HolderInput(BaseModel):
    path: str
    """The go-ahead file: the holder finishes once it exists."""


class HolderOutput(BaseModel):
    held: str


def _holder(messages: list[dict[str, Any]]) -> ScriptedTurn:
    path = HolderInput.model_validate(user_input(messages)).path
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(call("hold", path=path),))
    return finish(held=path)


holder = Agent(
    name="holder",
    description="Runs until its go-ahead file exists.",
    input_model=HolderInput,
    output_model=HolderOutput,
    tools=[hold],
    model=register_script("holder", _holder),
    max_steps=4,
)


class CloserInput(BaseModel):
    topics: list[str] = Field(min_length=1)
    """One task per entry: each a holder's go-ahead file."""


class CloserOutput(BaseModel):
    held: list[Any]
    """The results the parent was given when its finish was held (WAIT)."""


def _closer(messages: list[dict[str, Any]]) -> ScriptedTurn:
    wanted = CloserInput.model_validate(user_input(messages))
    if steps_taken(messages) == 0:
        tasks = [{"agent": "holder", "message": topic} for topic in wanted.topics]
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="run_subagent", arguments={"tasks": tasks}),)
        )
    held = [
        json.loads(str(m["content"]).split("\n")[1])
        for m in messages
        if m.get("role") == "user" and str(m.get("content", "")).startswith(HELD)
    ]
    return finish(held=held[-1] if held else [])  # at once: the tasks are still out


async def _hang_at_finish(ctx: ToolContext, messages: list[dict[str, Any]]) -> list[Any]:
    """The moment of finishing, made visible to a test that kills the service there."""
    mark = os.environ.get("HELIX_TEST_FINISH_MARK")
    if mark and not await asyncio.to_thread(Path(mark + ".done").exists):
        await asyncio.to_thread(Path(mark).write_text, ctx.session_id)
        await asyncio.Event().wait()  # until SIGKILL
    return []


def _closer_agent(name: str, policy: ClosePolicy) -> Agent:
    return with_dispatch(
        Agent(
            name=name,
            description=f"Dispatches research, then finishes at once ({policy.value}).",
            input_model=CloserInput,
            output_model=CloserOutput,
            model=register_script(name, _closer),
            max_steps=6,
            finish_hooks=[_hang_at_finish],
        ),
        [SubagentType(agent_type="holder", input_field="path", close_policy=policy)],
    )


terminating = _closer_agent("terminating", ClosePolicy.TERMINATE)
waiting = _closer_agent("waiting", ClosePolicy.WAIT)
abandoning = _closer_agent("abandoning", ClosePolicy.ABANDON)


# --- a companion with a queued message when its parent finishes ------------------------


class LeaverInput(BaseModel):
    drafts: list[str] = Field(min_length=2)


class LeaverOutput(BaseModel):
    sent: int


def _leaver(messages: list[dict[str, Any]]) -> ScriptedTurn:
    drafts = LeaverInput.model_validate(user_input(messages)).drafts
    done = steps_taken(messages)
    if done == 0:
        spawn = {"agent": "critic", "message": drafts[0], "name": "critic"}
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="companion__spawn_agent", arguments=spawn),)
        )
    if done == 1:  # the critic still reviews the first: queued
        send = {"name": "critic", "message": drafts[1]}
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="companion__send_message", arguments=send),)
        )
    return finish(sent=1)


leaver = with_companions(
    Agent(
        name="leaver",
        description="Starts a critic, queues it a second draft, and finishes at once.",
        input_model=LeaverInput,
        output_model=LeaverOutput,
        model=register_script("leaver", _leaver),
        max_steps=6,
    ),
    [PersistentChild(agent_type="critic", mode="non-blocking", input_field="artifact")],
)
