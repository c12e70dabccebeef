"""Agents for the child-id and tree-bound tests: an echo child, parents of each kind
of child (remote call, companion, ``run_subagent`` task) and self-delegating agents.

Children are found through the mesh registry (``HELIX_AGENT_ADDRESS_<TYPE>``).
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
    step_results,
    steps_taken,
    user_input,
)
from helix_transport.delegation.companions import PersistentChild, with_companions
from helix_transport.delegation.dispatch import SubagentType, with_dispatch
from helix_transport.delegation.remote import remote_agent_tool

ODD_CALL_ID = "call/+=1"
"""A provider tool call id outside the session-id alphabet."""


class EchoInput(BaseModel):
    text: str


class EchoOutput(BaseModel):
    echo: str


echo = Agent(
    name="echo",
    description="Answers with its input.",
    input_model=EchoInput,
    output_model=EchoOutput,
    # Scripts are registered by name, process-wide: "echo" is tests/agents/hostile.py's.
    model=register_script(
        "tree-echo", lambda m: finish(echo=EchoInput.model_validate(user_input(m)).text)
    ),
)


class Ask(BaseModel):
    text: str = "hi"


class Answer(BaseModel):
    answer: Any


def _one_call_then_answer(tool: str, arguments: dict[str, Any]) -> Any:
    """A script: call ``tool`` once (with ``ODD_CALL_ID``), then finish with its result."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            call = ScriptedToolCall(name=tool, arguments=arguments, id=ODD_CALL_ID)
            return ScriptedTurn(tool_calls=(call,))
        return finish(answer=[value for _, value in step_results(messages)])

    return script


remote_caller = Agent(
    name="remote-caller",
    description="Asks the echo agent through a remote call.",
    input_model=Ask,
    output_model=Answer,
    tools=[remote_agent_tool("ask", agent_type="echo", input_model=EchoInput)],
    model=register_script("remote-caller", _one_call_then_answer("ask", {"text": "hi"})),
)

companion_caller = with_companions(
    Agent(
        name="companion-caller",
        description="Asks the echo agent as a persistent child.",
        input_model=Ask,
        output_model=Answer,
        model=register_script(
            "companion-caller",
            _one_call_then_answer(
                "companion__spawn_agent", {"agent": "echo", "name": "helper", "message": "hi"}
            ),
        ),
    ),
    [PersistentChild(agent_type="echo", mode="blocking", input_field="text")],
)

RESULTS = "[sub-agent results]"


def _dispatcher(messages: list[dict[str, Any]]) -> ScriptedTurn:
    delivered = [
        str(m["content"])
        for m in messages
        if m.get("role") == "user" and str(m.get("content", "")).startswith(RESULTS)
    ]
    if delivered:
        return finish(answer=delivered[-1])
    if steps_taken(messages) == 0:
        tasks = [{"agent": "echo", "message": "hi"}]
        run = ScriptedToolCall(name="run_subagent", arguments={"tasks": tasks}, id=ODD_CALL_ID)
        return ScriptedTurn(tool_calls=(run,))
    return ScriptedTurn(text="Waiting for the task.")  # the pass ends: the run parks


task_caller = with_dispatch(
    Agent(
        name="task-caller",
        description="Asks the echo agent as a run_subagent task.",
        input_model=Ask,
        output_model=Answer,
        model=register_script("task-caller", _dispatcher),
        max_steps=6,
    ),
    [SubagentType(agent_type="echo", input_field="text")],
)


# --- trees ------------------------------------------------------------------------------


class Down(BaseModel):
    """What a delegating agent passes down (and is started with)."""

    text: str = "down"


def _delegate_once(messages: list[dict[str, Any]]) -> ScriptedTurn:
    """Delegate once, then finish with what came back (an output or an error)."""
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(ScriptedToolCall(name="down", arguments={}),))
    return finish(answer=step_results(messages)[0][1])


def delegating(name: str, child: str, *, recursive: bool = False, **options: Any) -> Agent:
    """An agent that delegates once to ``child`` (its own type: a self-delegating agent)."""
    return Agent(
        name=name,
        description=f"Delegates to {child} once.",
        input_model=Down,
        output_model=Answer,
        tools=[remote_agent_tool("down", agent_type=child, input_model=Down)],
        model=register_script("delegate-once", _delegate_once),
        recursive=recursive,
        **options,
    )


selfish = delegating("selfish", "selfish", recursive=True)
"""Delegates to its own type: only the depth limit ends the tree."""
ping = delegating("ping", "pong")
pong = delegating("pong", "ping")
"""``ping > pong > ping``: a cycle through another type."""


def _three_asks(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        asks = (ScriptedToolCall(name="ask", arguments={"text": f"hi {i}"}) for i in range(3))
        return ScriptedTurn(tool_calls=tuple(asks))
    return finish(answer=[value for _, value in step_results(messages)])


capped = Agent(
    name="capped",
    description="Asks the echo agent three times at once, with room for two children.",
    input_model=Ask,
    output_model=Answer,
    tools=[remote_agent_tool("ask", agent_type="echo", input_model=EchoInput)],
    model=register_script("capped", _three_asks),
    max_live_children=2,
)
