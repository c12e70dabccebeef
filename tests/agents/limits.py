"""Agents for the deadline and budget tests (``tests/delegation/test_limits.py``).

Children are found through the mesh registry (``HELIX_AGENT_ADDRESS_<TYPE>``):
``hurried`` asks ``slow`` (whose tool naps 30 s); ``budgeted`` asks ``middle`` with a
token budget of its own and ``sibling`` beside it; ``middle`` asks ``leaf`` (each
answer about 2000 tokens) until told to stop, or its budget stops it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from helix_transport import Agent
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    step_results,
    steps_taken,
)
from helix_transport.agent.tools import ToolContext, tool
from helix_transport.delegation.remote import remote_agent_tool

LEAF_TEXT = " ".join(f"w{n}" for n in range(1800))
"""What a leaf says in one model call: about 2000 tokens for the scripted model (words
that differ: litellm refuses a stream that repeats one chunk)."""
MIDDLE_BUDGET = 5000
"""The tokens ``budgeted`` gives the ``middle`` subtree."""
MIDDLE_CALLS = 6
"""How many times ``middle`` would ask ``leaf``, were there no budget."""


class Ask(BaseModel):
    text: str = "go"


class Answer(BaseModel):
    answer: Any


class Nap(BaseModel):
    seconds: float


@tool
async def nap(ctx: ToolContext, args: Nap) -> str:
    """Sleep a while: a child's long work."""
    await asyncio.sleep(args.seconds)
    return "rested"


slow = Agent(
    name="slow",
    description="Works for 30 s.",
    input_model=Ask,
    output_model=Answer,
    tools=[nap],
    model=register_script(
        "limits-slow",
        lambda m: (
            ScriptedTurn(tool_calls=(ScriptedToolCall(name="nap", arguments={"seconds": 30}),))
            if steps_taken(m) == 0
            else finish(answer="done")
        ),
    ),
)


def _ask_once_then_answer(tool_names: tuple[str, ...]) -> Any:
    """Call each of ``tool_names`` in the first step; finish with every result so far
    in any later one (the last pass included)."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            calls = tuple(ScriptedToolCall(name=n, arguments={"text": "go"}) for n in tool_names)
            return ScriptedTurn(tool_calls=calls)
        # Every result so far: the last pass comes after a message of its own.
        return finish(answer=[m["content"] for m in messages if m.get("role") == "tool"])

    return script


hurried = Agent(
    name="hurried",
    description="Asks slow, answers with whatever it has.",
    input_model=Ask,
    output_model=Answer,
    tools=[remote_agent_tool("ask_slow", agent_type="slow", input_model=Ask)],
    model=register_script("limits-hurried", _ask_once_then_answer(("ask_slow",))),
)


leaf = Agent(
    name="leaf",
    description="Answers at length (about 2000 tokens).",
    input_model=Ask,
    output_model=Answer,
    # One model call that says a lot, slowly enough for a test to kill the middle
    # service while a leaf works.
    model=register_script(
        "limits-leaf",
        lambda m: ScriptedTurn(
            text=LEAF_TEXT, tool_calls=finish(answer="short").tool_calls, latency_s=1.0
        ),
    ),
)


def _middle(messages: list[dict[str, Any]]) -> ScriptedTurn:
    done = steps_taken(messages)
    if done < MIDDLE_CALLS:
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="ask_leaf", arguments={"text": str(done)}),)
        )
    return finish(answer=len(step_results(messages)))


middle = Agent(
    name="middle",
    description="Asks leaf again and again.",
    input_model=Ask,
    output_model=Answer,
    tools=[remote_agent_tool("ask_leaf", agent_type="leaf", input_model=Ask)],
    model=register_script("limits-middle", _middle),
)

sibling = Agent(
    name="sibling",
    description="Answers at once.",
    input_model=Ask,
    output_model=Answer,
    model=register_script("limits-sibling", lambda m: finish(answer="sibling done")),
)

budgeted = Agent(
    name="budgeted",
    description="Asks middle (within a budget) and sibling.",
    input_model=Ask,
    output_model=Answer,
    tools=[
        remote_agent_tool(
            "ask_middle", agent_type="middle", input_model=Ask, budget_tokens=MIDDLE_BUDGET
        ),
        remote_agent_tool("ask_sibling", agent_type="sibling", input_model=Ask),
    ],
    model=register_script("limits-budgeted", _ask_once_then_answer(("ask_middle", "ask_sibling"))),
)
