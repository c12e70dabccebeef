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
from helix_transport.delegation.remote import remote_agent_tool
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
    "approving", tool(name="send", description="Send a message.", approval=True)(_send)
)
"""Asks for an approval of each ``send``."""

unasking = _agent("unasking", tool(name="send", description="Send a message.")(_send))
"""The same agent, but ``send`` runs without asking."""


def _relay(messages: list[dict[str, object]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        return ScriptedTurn(tool_calls=(call("relay", **user_input(messages)),))
    result = tool_results(messages).get("relay")
    return finish(sent=isinstance(result, dict) and result.get("sent") is True, result=result)


relaying = Agent(
    name="relaying",
    description="Hands its input to a remote approving agent and reports what it did.",
    input_model=SendInput,
    output_model=SendOutput,
    tools=[remote_agent_tool("relay", agent_type="approving", input_model=SendInput)],
    model=register_script("relaying", _relay),
    max_steps=4,
)
"""A parent of ``approving`` (found as ``HELIX_AGENT_ADDRESS_APPROVING``): a request for
input two levels down, and a suspension that cascades up."""
