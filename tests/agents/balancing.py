"""An agent that says which process ran it (tests.agents.balancing:whoami).

The connection-balancing tests run it on two replicas behind one name: a session's
output names the process id of the replica that ran it, and ``ticks`` makes a run as
long as a test needs (one tick per step, a few streamed words each, slowed by
``HELIX_SCRIPTED_DELAY_MS``) so its stream outlives a connection's maximum age.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, Field

from helix_transport import Agent, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
    tool_results,
    user_input,
)


class WhoAmIInput(BaseModel):
    ticks: int = Field(default=1, ge=1, le=200)


class WhoAmIOutput(BaseModel):
    pid: int


class NoArgs(BaseModel):
    pass


@tool
async def pid(ctx: ToolContext, args: NoArgs) -> int:
    """The process id of the replica running this step."""
    return os.getpid()


def _script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    ticks = WhoAmIInput.model_validate(user_input(messages)).ticks
    step = steps_taken(messages)
    if step < ticks:
        return ScriptedTurn(text=f"tick {step + 1} of {ticks} ", tool_calls=(call("pid"),))
    return finish(pid=tool_results(messages)["pid"])


whoami = Agent(
    name="whoami",
    description="Answers with the process id of the replica that ran it.",
    input_model=WhoAmIInput,
    output_model=WhoAmIOutput,
    tools=[pid],
    model=register_script("balancing-whoami", _script),
    max_steps=201,
)
