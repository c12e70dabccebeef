"""Running one tool call of a step: its events, its hooks, its result as the model sees it.

A failing tool is the model's problem to handle, not the run's: whatever it raises
(but a cancellation of the step) becomes an error result. The finish tool validates
the output instead of calling anything; its events are deferred to the run's end,
which writes them in the same store write as ``completed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import RunHooks
from helix_transport.agent.model import ToolCall
from helix_transport.agent.tools import (
    FINISH_TOOL,
    ToolArgumentError,
    ToolContext,
    ToolError,
    describe_validation_error,
    dump_result,
)
from helix_transport.log import SessionWriter

logger = logging.getLogger("helix.loop")

MAX_RESULT_BYTES = 1 << 20
"""Largest tool result or output a run logs. Each is one event, and an event must fit in
one gRPC message, also wrapped by every parent that forwards it (4 MiB by default):
a larger one would be logged but could never be streamed, nor anything after it."""

MAX_ERROR_BYTES = 16 << 10
"""Most of an error message a run logs (a tool's, a provider's): a client that puts a whole
response body in its exception must not make an event no stream can send."""


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    """A tool call's answer: the message the model sees, and the run's output if it
    was the finish tool's and valid."""

    message: dict[str, Any]
    output_json: str | None = None


class ToolRunner:
    """Runs the tool calls of one session's steps."""

    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str,
        writer: SessionWriter,
        hooks: RunHooks,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.agent = agent
        self.session_id = session_id
        self.writer = writer
        self.hooks = hooks
        self.max_result_bytes = max_result_bytes

    async def run(
        self, call: ToolCall, context: Callable[[str], ToolContext], *, record: bool = False
    ) -> ToolOutcome:
        """Run ``call`` (``context`` makes its ``ToolContext`` from its id).

        With ``record`` (a call that runs at most once) its ``tool_end`` is durable in
        the log before this returns: a run resumed after a crash that cut the step off
        takes the result from there instead of calling it unknown.
        """
        # The finish tool's events, its output and the run's end go in one write.
        finishing = call.name == FINISH_TOOL
        self.writer.emit(
            pb.StreamEvent(
                tool_start=pb.ToolStart(
                    tool_call_id=call.id, tool_name=call.name, arguments_json=call.arguments_json
                )
            ),
            defer=finishing,
        )
        self.hooks.on_tool_start(
            name=call.name, tool_call_id=call.id, arguments_json=call.arguments_json
        )
        result, is_error, output_json = await self._outcome(call, context, finishing=finishing)
        self.writer.emit(
            pb.StreamEvent(
                tool_end=pb.ToolEnd(
                    tool_call_id=call.id, tool_name=call.name, result_json=result, is_error=is_error
                )
            ),
            defer=output_json is not None,  # the run ends with this step: its end writes it
        )
        self.hooks.on_tool_end(
            name=call.name, tool_call_id=call.id, result_json=result, is_error=is_error
        )
        if record:
            await self.writer.flush()
        message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result}
        return ToolOutcome(message=message, output_json=output_json)

    async def _outcome(
        self, call: ToolCall, context: Callable[[str], ToolContext], *, finishing: bool
    ) -> tuple[str, bool, str | None]:
        """What ``call`` gave: its result, whether that is an error, and the run's
        output when it is the finish tool's and valid."""
        output_json: str | None = None
        try:
            if finishing:
                output = self.agent.output_model.model_validate_json(call.arguments_json or "{}")
                output_json = self.within_limit(output.model_dump_json(), "the output")
                result, is_error = json.dumps({"ok": True}), False
            else:
                result = await self._call_tool(call, context)
                result, is_error = self.within_limit(result, f"tool {call.name!r}'s result"), False
        except ValidationError as exc:
            problem = clipped(f"invalid output: {describe_validation_error(exc)}")
            # Recoverable: the model sees the problem and gets another step.
            self.writer.emit(pb.StreamEvent(error=pb.Error(message=problem, code="invalid_output")))
            result, is_error = json.dumps({"error": problem}), True
        except ToolError as exc:
            result, is_error = json.dumps({"error": clipped(exc.message)}), True
        except TimeoutError:
            result, is_error = json.dumps({"error": f"tool {call.name!r} timed out"}), True
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is None or current.cancelling():
                raise  # the step is being cancelled (an interrupt, a lost lease, a drain)
            # The tool's own doing (it awaited a task it had cancelled, say): its
            # failure, as any other error, not an interrupt of the whole run.
            logger.warning("tool %s cancelled itself in session %s", call.name, self.session_id)
            result, is_error = json.dumps({"error": "CancelledError: the tool was cancelled"}), True
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit and a library's own BaseExceptions too
            # A failing tool is the model's problem to handle, not the run's (and not
            # the process's: sys.exit() in one tool must not stop every session).
            logger.warning(
                "tool %s failed in session %s", call.name, self.session_id, exc_info=True
            )
            result, is_error = json.dumps({"error": clipped(f"{type(exc).__name__}: {exc}")}), True
        return result, is_error, output_json

    def answered(self, call: ToolCall, result: str, *, is_error: bool) -> ToolOutcome:
        """``call`` ended by its request's answer, not by running the tool: a client
        tool's result, or the error of a denial, a client tool's failure or a deadline."""
        if is_error:
            result = json.dumps({"error": clipped(result)})
        else:
            try:
                result = self.within_limit(result, f"tool {call.name!r}'s result")
            except ToolError as exc:
                result, is_error = json.dumps({"error": exc.message}), True
        start = pb.ToolStart(
            tool_call_id=call.id, tool_name=call.name, arguments_json=call.arguments_json
        )
        self.writer.emit(pb.StreamEvent(tool_start=start))
        self.hooks.on_tool_start(
            name=call.name, tool_call_id=call.id, arguments_json=call.arguments_json
        )
        end = pb.ToolEnd(
            tool_call_id=call.id, tool_name=call.name, result_json=result, is_error=is_error
        )
        self.writer.emit(pb.StreamEvent(tool_end=end))
        self.hooks.on_tool_end(
            name=call.name, tool_call_id=call.id, result_json=result, is_error=is_error
        )
        message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result}
        return ToolOutcome(message=message)

    def within_limit(self, text: str, what: str) -> str:
        """``text``, or ``ToolError`` when it is too large to log as one event."""
        most = self.max_result_bytes
        if len(text) * 4 > most and len(encoded := text.encode()) > most:  # cheap when small
            raise ToolError(
                f"{what} is {len(encoded)} bytes, over the {most} bytes one event may carry: "
                "return less (a summary, or where to find the rest)"
            )
        return text

    async def _call_tool(self, call: ToolCall, context: Callable[[str], ToolContext]) -> str:
        tool = self.agent.tool(call.name)
        if tool is None:
            known = ", ".join(t.name for t in self.agent.tools) or "none"
            raise ToolArgumentError(call.name, f"no such tool (available: {known}, {FINISH_TOOL})")
        args = tool.parse_args(call.arguments_json)
        ctx = context(call.id)
        async with asyncio.timeout(tool.timeout_s):
            return dump_result(await tool.fn(ctx, args))


def clipped(text: str, most: int = MAX_ERROR_BYTES) -> str:
    """``text`` cut to about ``most`` UTF-8 bytes, saying how much was cut."""
    if len(text) * 4 <= most:  # cheap when small
        return text
    encoded = text.encode("utf-8", "replace")  # a lone surrogate counts as one byte
    if len(encoded) <= most:
        return text
    kept = encoded[:most].decode("utf-8", "ignore")
    return f"{kept}… ({len(encoded) - len(kept.encode('utf-8', 'replace'))} bytes cut)"
