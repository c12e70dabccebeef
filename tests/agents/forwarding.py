"""A delegation tree with every kind of child at every level, for the forwarding proof.

``fw-root`` and ``fw-mid`` each delegate, in one step, to one child of every kind: a
remote tool call (``down``), a blocking companion (``companion__spawn_agent``) and a
``run_subagent`` task; then they park until the task's result arrives and finish with
all three. ``fw-root``'s children are ``fw-mid``s, theirs ``fw-leaf``s, which stream a
few steps of text (slowed by ``HELIX_SCRIPTED_DELAY_MS``) before they finish. So one
root makes 13 sessions over three services, three levels deep, and every session's
model calls report usage (the scripted provider counts its words as tokens).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from helix_transport import Agent
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    steps_taken,
    user_input,
)
from helix_transport.delegation.companions import PersistentChild, with_companions
from helix_transport.delegation.dispatch import SubagentType, with_dispatch
from helix_transport.delegation.remote import remote_agent_tool

LEAF_STEPS = 3
RESULTS = "[sub-agent results]"


class Down(BaseModel):
    text: str = "down"


class Answer(BaseModel):
    answer: Any


def _leaf(messages: list[dict[str, Any]]) -> ScriptedTurn:
    text = str(user_input(messages).get("text", ""))
    done = steps_taken(messages)
    if done < LEAF_STEPS:
        # A tool-less turn ends the pass: the loop nudges and asks again, one step each.
        return ScriptedTurn(text=f"working on {text}, step {done + 1} of {LEAF_STEPS}")
    return finish(answer=f"leaf: {text}")


fw_leaf = Agent(
    name="fw-leaf",
    description="Works a few steps on its text, then answers.",
    input_model=Down,
    output_model=Answer,
    model=register_script("fw-leaf", _leaf),
    max_steps=LEAF_STEPS + 2,
)


def _delegator(messages: list[dict[str, Any]], child: str) -> ScriptedTurn:
    text = str(user_input(messages).get("text", ""))
    if steps_taken(messages) == 0:
        task = {"agent": child, "message": f"{text}/task"}
        spawn = {"agent": child, "name": "helper", "message": f"{text}/companion"}
        return ScriptedTurn(
            tool_calls=(
                ScriptedToolCall(name="down", arguments={"text": f"{text}/remote"}),
                ScriptedToolCall(name="companion__spawn_agent", arguments=spawn),
                ScriptedToolCall(name="run_subagent", arguments={"tasks": [task]}),
            )
        )
    delivered = [
        str(m["content"])
        for m in messages
        if m.get("role") == "user" and str(m.get("content", "")).startswith(RESULTS)
    ]
    if delivered:
        results = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        return finish(answer={"calls": results, "tasks": delivered[-1]})
    return ScriptedTurn(text="waiting for the task")  # the pass ends: the run parks


def _delegating(name: str, child: str) -> Agent:
    agent = Agent(
        name=name,
        description=f"Delegates to {child} in every way at once.",
        input_model=Down,
        output_model=Answer,
        tools=[remote_agent_tool("down", agent_type=child, input_model=Down)],
        model=register_script(name, lambda m: _delegator(m, child)),
        max_steps=8,
    )
    agent = with_companions(agent, [PersistentChild(agent_type=child, input_field="text")])
    return with_dispatch(agent, [SubagentType(agent_type=child, input_field="text")])


fw_mid = _delegating("fw-mid", "fw-leaf")
fw_root = _delegating("fw-root", "fw-mid")
