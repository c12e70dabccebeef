"""Declaring tools that wait for people: what is refused when the agent is defined, and
which calls wait."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from helix_transport import Agent, ToolContext, UsageError, client_tool, tool
from helix_transport.agent.tools import Tool


class Args(BaseModel):
    amount: int = 0


async def _run(ctx: ToolContext, args: Any) -> Any:
    return {}


def test_approval_by_a_rule_of_the_arguments_and_a_failing_rule_asks() -> None:
    def big(args: Args) -> bool:
        return args.amount > 100

    def broken(args: Args) -> bool:
        raise RuntimeError("rule bug")

    rule = Tool(name="refund", description="", args_model=Args, fn=_run, approval=big)
    assert rule.input_kind(Args(amount=500)) == "approval"
    assert rule.input_kind(Args(amount=5)) is None
    failing = Tool(name="refund", description="", args_model=Args, fn=_run, approval=broken)
    assert failing.input_kind(Args()) == "approval"  # a broken rule never skips a person
    assert Tool(name="x", description="", args_model=Args, fn=_run).input_kind(Args()) is None


def test_a_client_tool_has_no_server_side_and_cannot_also_ask_for_approval() -> None:
    picked = client_tool("pick", description="Pick one.", args_model=Args, input_timeout_s=30)
    assert picked.client and picked.input_kind(Args()) == "client_result"
    with pytest.raises(UsageError, match="cannot also require approval"):
        Tool(name="pick", description="", args_model=Args, fn=_run, client=True, approval=True)


def test_a_deadline_needs_a_tool_that_waits_and_must_be_positive() -> None:
    with pytest.raises(UsageError, match="needs approval"):
        Tool(name="x", description="", args_model=Args, fn=_run, input_timeout_s=5)
    with pytest.raises(UsageError, match="positive"):

        @tool(approval=True, input_timeout_s=0)
        async def gated(ctx: ToolContext, args: Args) -> dict[str, Any]:
            return {}


def test_the_finish_tool_cannot_be_declared_at_all() -> None:
    finish = Tool(name="__finish__", description="", args_model=Args, fn=_run, approval=True)
    with pytest.raises(UsageError, match="__finish__"):
        Agent(name="a", description="", input_model=Args, output_model=Args, tools=[finish])
