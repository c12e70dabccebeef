"""A root session's last pass once a limit is exceeded, and the calls a cut-off step left.

The last pass is one model call offered only the finish tool, after a message saying
which limit passed: the session answers with what it has (its children's tool results
already say they were stopped, and why). Any other call it makes is answered, not run.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._steps import RunProgress, unanswered_tool_calls, with_unique_call_ids
from helix_transport.agent._tool_runner import ToolOutcome
from helix_transport.agent.inputs import InputState
from helix_transport.agent.limits import LAST_PASS_ASK, LAST_PASS_PROMPT, cut_off_result
from helix_transport.agent.model import ModelResponse, ToolCall
from helix_transport.agent.tools import FINISH_TOOL
from helix_transport.log import SessionWriter


@dataclass(frozen=True, kw_only=True)
class LastPass:
    """The loop's pieces the last pass uses."""

    writer: SessionWriter
    call_model: Callable[[], Awaitable[ModelResponse]]
    """A model call offered the finish tool only."""
    count: Callable[[ModelResponse], None]
    """Adds a response's usage to the run's."""
    run_tool: Callable[[ToolCall], Awaitable[ToolOutcome]]

    async def run(self, state: RunProgress, limit: str) -> str | None:
        """One step that may only finish: its valid output, or ``None``."""
        step = state.step + 1
        self.writer.step = step
        self.writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))
        state.messages.append({"role": "user", "content": LAST_PASS_PROMPT[limit] + LAST_PASS_ASK})
        response = with_unique_call_ids(await self.call_model(), state.messages)
        self.count(response)
        state.messages.append(response.to_message())
        state.step = step
        output: str | None = None
        for call in response.tool_calls:
            if call.name != FINISH_TOOL or output is not None:
                state.messages.append(_tool_message(call, "not run: this was the last pass"))
                continue
            outcome = await self.run_tool(call)
            state.messages.append(outcome.message)
            output = outcome.output_json
        return output


def answer_cut_off(state: RunProgress, limit: str, writer: SessionWriter) -> None:
    """Give the calls a cut-off step left without a result one saying why (a ``tool_end``
    in the log, a tool message in the conversation), and forget the step's waits."""
    for call in unanswered_tool_calls(state.messages) or []:
        message = _tool_message(call, cut_off_result(limit))
        end = pb.ToolEnd(
            tool_call_id=call.id, tool_name=call.name, result_json=message["content"], is_error=True
        )
        writer.emit(pb.StreamEvent(tool_end=end))
        state.messages.append(message)
    InputState().save(state.run)


def _tool_message(call: ToolCall, error: str) -> dict[str, Any]:
    content = json.dumps({"error": error})
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}
