"""A three-level delegation for the A2A tests: ``a2a-top`` asks ``a2a-mid``, which asks
the ``mailer`` service (``services.mailer``), whose email waits for a person's approval.

Importable by server subprocesses (``tests.agents.a2a_tree:NAME``); children are found
through the mesh registry (``HELIX_AGENT_ADDRESS_<TYPE>``). Each level streams some
text first, so a stream has events at every depth.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

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
from helix_transport.delegation.remote import remote_agent_tool
from services.mailer.agent import agent as mailer_agent


class Brief(BaseModel):
    """What to have mailed, in words (a plain A2A text message fills it)."""

    request: str = Field(min_length=1, description="What to email, and to whom.")


class Relayed(BaseModel):
    result: Any = None


def _relay(tool_name: str, chatter: int) -> Any:
    """Say ``chatter`` words, call ``tool_name`` with the input, finish with its result."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            return ScriptedTurn(
                text=" ".join(f"w{n}" for n in range(chatter)),
                tool_calls=(ScriptedToolCall(name=tool_name, arguments=user_input(messages)),),
            )
        return finish(result=[value for _, value in step_results(messages)])

    return script


mid = Agent(
    name="a2a-mid",
    description="Has the mailer send an email.",
    input_model=Brief,
    output_model=Relayed,
    tools=[remote_agent_tool("email", agent_type="mailer", input_model=Brief)],
    model=register_script("a2a-mid", _relay("email", chatter=20)),
)

top = Agent(
    name="a2a-top",
    description="Asks a2a-mid, which asks the mailer, to send an email.",
    input_model=Brief,
    output_model=Relayed,
    tools=[remote_agent_tool("relay", agent_type="a2a-mid", input_model=Brief)],
    model=register_script("a2a-top", _relay("relay", chatter=40)),
)


mailer_alone = mailer_agent
"""The mailer by itself (in-process tests)."""
