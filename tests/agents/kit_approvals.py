"""An agent whose ``send`` tool waits for a person's approval (the conformance kit's
``--input-required``), and its twin whose ``send`` does not ask: what a service that
ignores approvals runs."""

from __future__ import annotations

from pydantic import BaseModel, Field

from helix_transport import Agent, Tool, ToolContext, tool
from helix_transport.agent.scripted import (
    ScriptedTurn,
    call,
    finish,
    register_script,
    steps_taken,
    tool_results,
    user_input,
)
from tests.agents import tick


class SendInput(BaseModel):
    to: str
    ask: bool = True
    """Call ``send`` (which waits for approval) after the ticks; False: finish after them."""
    ticks: int = Field(default=0, ge=0, le=50)
    """Steps of the plain ``tick`` tool first (with ``HELIX_SCRIPTED_DELAY_MS``: a slow run)."""


class SendOutput(BaseModel):
    sent: bool
    result: object


class SendArgs(BaseModel):
    to: str


async def _send(ctx: ToolContext, args: SendArgs) -> dict[str, str]:
    return {"sent_to": args.to}


def _script(messages: list[dict[str, object]]) -> ScriptedTurn:
    wanted = SendInput.model_validate(user_input(messages))
    done = steps_taken(messages)
    if done < wanted.ticks:
        return ScriptedTurn(text="tick ", tool_calls=(call("tick", n=done + 1),))
    if wanted.ask and done == wanted.ticks:
        return ScriptedTurn(text="Sending. ", tool_calls=(call("send", to=wanted.to),))
    result = tool_results(messages).get("send")
    sent = isinstance(result, dict) and "sent_to" in result
    return finish(sent=sent, result=result)


def _agent(name: str, send: Tool) -> Agent:
    return Agent(
        name=name,
        description="Ticks, then sends a message once a person approves.",
        input_model=SendInput,
        output_model=SendOutput,
        tools=[tick, send],
        model=register_script(name, _script),
        max_steps=60,
    )


approving = _agent(
    "approving", tool(_send, name="send", description="Send a message.", approval=True)
)
"""Asks for an approval of each ``send``."""

unasking = _agent("unasking", tool(_send, name="send", description="Send a message."))
"""The same agent, but ``send`` runs without asking."""
