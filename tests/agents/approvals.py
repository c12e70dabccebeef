"""Agents that wait for people: an approval-gated tool, a client tool, a deadline, and
parents of them at every depth (remote tool, siblings, ``run_subagent``).

Importable by server subprocesses (``tests.agents.approvals:NAME``). Children are found
through the mesh registry (``HELIX_AGENT_ADDRESS_<TYPE>``). The gated tool records each
time it really runs in the file ``HELIX_TEST_SENT_LOG`` names (one JSON line per run),
so a test can count runs across processes and crashes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel

from helix_transport import Agent, ToolContext, client_tool, tool
from helix_transport.agent.scripted import (
    ScriptedToolCall,
    ScriptedTurn,
    finish,
    register_script,
    step_results,
    steps_taken,
    user_input,
)
from helix_transport.delegation.dispatch import SubagentType, with_dispatch
from helix_transport.delegation.remote import remote_agent_tool

SENT_LOG = "HELIX_TEST_SENT_LOG"


class Mail(BaseModel):
    to: str = "ops@example.com"
    body: str = "hello"


class Outcome(BaseModel):
    result: Any = None


@tool(approval=True)
async def send(ctx: ToolContext, args: Mail) -> dict[str, Any]:
    """Send a mail (a person approves each one)."""
    path = os.environ.get(SENT_LOG)
    if path:
        with open(path, "a", encoding="utf-8") as log:  # noqa: ASYNC230  (tests: one line)
            log.write(json.dumps({"session_id": ctx.session_id, "call": ctx.tool_call_id}) + "\n")
    return {"sent_to": args.to}


@tool(approval=lambda args: args.to.endswith("@outside.example"))
async def maybe_send(ctx: ToolContext, args: Mail) -> dict[str, Any]:
    """Send a mail; only mail leaving the company needs an approval."""
    return {"sent_to": args.to}


@tool(approval=True, input_timeout_s=1.0)
async def hurry(ctx: ToolContext, args: Mail) -> dict[str, Any]:
    """Send a mail if approved within a second."""
    return {"sent_to": args.to}


class Pick(BaseModel):
    options: list[str] = ["red", "blue"]


pick = client_tool("pick", description="Ask the user to pick one option.", args_model=Pick)


def _call_then_finish(*calls: ScriptedToolCall) -> Any:
    """Call ``calls`` in step 1, then finish with their results (in call order)."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            return ScriptedTurn(tool_calls=calls)
        return finish(result=[value for _, value in step_results(messages)])

    return script


def _from_input(tool_name: str) -> Any:
    """Call ``tool_name`` with the run's input as arguments, then finish with its result."""

    def script(messages: list[dict[str, Any]]) -> ScriptedTurn:
        if steps_taken(messages) == 0:
            return ScriptedTurn(
                tool_calls=(ScriptedToolCall(name=tool_name, arguments=user_input(messages)),)
            )
        return finish(result=[value for _, value in step_results(messages)])

    return script


mailer = Agent(
    name="hitl-mailer",
    description="Sends one mail, once a person approves it.",
    input_model=Mail,
    output_model=Outcome,
    tools=[send, maybe_send],
    model=register_script("hitl-mailer", _from_input("send")),
)

picker = Agent(
    name="hitl-picker",
    description="Asks the client to pick an option.",
    input_model=Pick,
    output_model=Outcome,
    tools=[pick],
    model=register_script("hitl-picker", _from_input("pick")),
)

hasty = Agent(
    name="hitl-hasty",
    description="Sends one mail if approved within a second.",
    input_model=Mail,
    output_model=Outcome,
    tools=[hurry],
    model=register_script("hitl-hasty", _from_input("hurry")),
)

middle = Agent(
    name="hitl-middle",
    description="Asks the mailer to send a mail.",
    input_model=Mail,
    output_model=Outcome,
    tools=[remote_agent_tool("mail", agent_type="hitl-mailer", input_model=Mail)],
    model=register_script("hitl-middle", _from_input("mail")),
)

root = Agent(
    name="hitl-root",
    description="Asks the middle agent, which asks the mailer.",
    input_model=Mail,
    output_model=Outcome,
    tools=[remote_agent_tool("relay", agent_type="hitl-middle", input_model=Mail)],
    model=register_script("hitl-root", _from_input("relay")),
)

fanout = Agent(
    name="hitl-fanout",
    description="Sends two mails through two mailer children at once, and picks a color.",
    input_model=Mail,
    output_model=Outcome,
    tools=[remote_agent_tool("mail", agent_type="hitl-mailer", input_model=Mail)],
    model=register_script(
        "hitl-fanout",
        _call_then_finish(
            ScriptedToolCall(name="mail", arguments={"to": "a@example.com"}, id="call_a"),
            ScriptedToolCall(name="mail", arguments={"to": "b@example.com"}, id="call_b"),
        ),
    ),
)


class Task(BaseModel):
    colors: list[str] = ["red", "blue"]


def _dispatcher_script(messages: list[dict[str, Any]]) -> ScriptedTurn:
    if steps_taken(messages) == 0:
        picked = json.dumps({"options": user_input(messages).get("colors", ["red"])})
        task = {"agent": "hitl-picker", "message": picked}
        return ScriptedTurn(
            tool_calls=(ScriptedToolCall(name="run_subagent", arguments={"tasks": [task]}),)
        )
    delivered = [
        m["content"] for m in messages if "[sub-agent results]" in str(m.get("content", ""))
    ]
    if not delivered:
        return ScriptedTurn(text="waiting for the task")  # ends the pass: the run parks
    return finish(result=delivered[-1])


dispatcher = with_dispatch(
    Agent(
        name="hitl-dispatcher",
        description="Runs the picker as a run_subagent task.",
        input_model=Task,
        output_model=Outcome,
        model=register_script("hitl-dispatcher", _dispatcher_script),
    ),
    [SubagentType(agent_type="hitl-picker", input_field=None, description="Asks to pick.")],
)
