"""A helix parent whose one tool is an A2A agent (``tests.a2a.child_fixture``).

The agent is found through the mesh registry at call time:
``HELIX_AGENT_ADDRESS_STEPS_AGENT=a2a:http://127.0.0.1:PORT``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from helix_transport import Agent
from helix_transport.a2a.child import a2a_agent_tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)
from tests.a2a.child_fixture import INPUT_SCHEMA


class PeerInput(BaseModel):
    steps: int = 4
    delay_s: float = 0.2
    ask: bool = False
    usage: bool = False


class Answer(BaseModel):
    answer: Any


def _parent(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(
            text="Asking the peer. ", tool_calls=(call("steps", **user_input(messages)),)
        )
    return finish(answer=[value for _, value in step_results(messages)])


a2a_parent = Agent(
    name="a2a-parent",
    description="Hands its input to an A2A agent and answers with what it returns.",
    input_model=PeerInput,
    output_model=Answer,
    tools=[a2a_agent_tool(agent_type="steps-agent", name="steps", parameters=INPUT_SCHEMA)],
    model=register_script("a2a-parent", _parent),
    max_steps=4,
)
