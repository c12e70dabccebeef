"""What one step of the run loop decides, and the progress it decides on.

A step turns the model's answer into a ``NextStep`` (``agent.loop`` matches on it):

- ``CallTools``: run these tool calls (checkpointed first when they have effects);
- ``RunAgain``: take another step (no tool was called, or the tools ran and none
  finished the run);
- ``FinalOutput``: the finish tool returned a valid output, the run completes;
- ``Interrupted``: an interrupt cut the step off (``RunLoop._race``);
- ``Suspend``: the step waits for people and nothing else runs (``agent.inputs``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from helix_transport._exceptions import AgentRunError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.blockage import BlockedChild
from helix_transport.agent.model import ModelResponse, ToolCall, new_tool_call_id
from helix_transport.agent.state import RunState, joined_state
from helix_transport.agent.tools import FINISH_TOOL
from helix_transport.store import Usage

FINISH_INSTRUCTIONS = (
    f"When the task is done, call the `{FINISH_TOOL}` tool with the final output; "
    "its arguments must match its schema exactly."
)
NUDGE = f"Continue the task. To end it, call `{FINISH_TOOL}` with the final output."


@dataclass(frozen=True)
class CallTools:
    """Run ``calls`` (concurrently), then decide again."""

    calls: list[ToolCall]


@dataclass(frozen=True)
class RunAgain:
    """Take another step."""


@dataclass(frozen=True)
class FinalOutput:
    """The run is done: ``output_json`` is its validated output."""

    output_json: str


@dataclass(frozen=True)
class Interrupted:
    """An interrupt cut the step off."""


@dataclass(frozen=True)
class Suspend:
    """The step waits for input (its own requests, or suspended children's) and has
    nothing else to run: the session suspends."""

    blocked: dict[str, BlockedChild]
    """The step's calls that wait for a suspended child, by call id."""


NextStep = CallTools | RunAgain | FinalOutput | Interrupted | Suspend


@dataclass(kw_only=True)
class RunProgress:
    """What a run has done so far: what its checkpoint holds."""

    step: int
    messages: list[dict[str, Any]]
    usage: Usage = field(default_factory=Usage)
    state: dict[str, Any] = field(default_factory=dict)
    """The tools' free-form state, checkpointed with the messages (``ToolContext.state``)."""
    run: RunState = field(default_factory=RunState)
    """The library's state of the run, checkpointed beside ``state`` (``agent.state``)."""
    error: str = ""
    """Why the run failed, for the hooks (the log and the record have it already)."""
    from_sequence: int = 0
    """Where the log ended at the checkpoint this run began from (0: none): what a
    crash cut off was logged after it."""


class _StateNotJSON(AgentRunError):
    failure_reason = "invalid_state"


def storable(progress: RunProgress) -> dict[str, Any]:
    """The checkpoint's ``state`` (the tools' and the run state), checked to be JSON
    before a checkpoint carries it to the store.

    A tool that leaves another value there (a set, an object) fails the run with a
    clear error; the store would refuse the checkpoint, and the run would crash and
    resume into the same refusal.
    """
    state = joined_state(progress.state, progress.run)
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise _StateNotJSON(f"ToolContext.state must hold JSON values only: {exc}") from None
    return state


def resumed_event(step: int, reason: str) -> pb.StreamEvent:
    """A resumed run's first event: the step that starts again, and why."""
    return pb.StreamEvent(run_resumed=pb.RunResumed(step=step, reason=reason or "restart"))


def with_unique_call_ids(response: ModelResponse, messages: list[dict[str, Any]]) -> ModelResponse:
    """``response`` with every tool call id new to the conversation.

    Children are named after their tool call (``{parent}-remote-{id}``): a provider that
    repeats an id (``call_0`` at every step) would make a later call rejoin an earlier
    call's child and get its result. A repeat gets an id of our own before the step's
    checkpoint, so a resumed run re-runs the call under the same id.
    """
    if not response.tool_calls:
        return response
    used = {
        c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or ()
    }
    calls = []
    for call in response.tool_calls:
        if call.id in used:
            call = replace(call, id=new_tool_call_id())
        used.add(call.id)
        calls.append(call)
    if calls == response.tool_calls:
        return response
    return replace(response, tool_calls=calls)


def unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[ToolCall] | None:
    """The tool calls of a step cut off after its model call, or ``None``."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return None
    return [
        ToolCall(id=c["id"], name=c["function"]["name"], arguments_json=c["function"]["arguments"])
        for c in last["tool_calls"]
    ]
