"""A step's requests for input: asked once, answered from the store, applied once.

``ask`` runs when the model's calls are known, before the step's checkpoint: each call
that needs an approval or a client's result becomes a pending request and an
``input_required`` event in that same write. ``resolve`` runs each time the step runs
(first, and after every resume): it reads the answers the store holds, expires what
passed its deadline (as an answer of its own, stored the same way, so an answer and a
deadline racing end one way only), logs ``input_answered`` for each, and says which
calls run now. The rest wait; the loop suspends when nothing else runs.
"""

from __future__ import annotations

import time
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._tool_runner import ToolRunner
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import RunHooks
from helix_transport.agent.inputs import Answer, InputState, Request, request_event
from helix_transport.agent.model import ToolCall
from helix_transport.agent.tools import FINISH_TOOL, ToolArgumentError
from helix_transport.log import SessionWriter
from helix_transport.store import InputStore

OUTCOME_UNKNOWN = (
    "the approved call's outcome is unknown: the service stopped while it ran, and an "
    "approved call never runs twice; check its effect before asking again"
)
FINISH_WITH_INPUT = (
    f"`{FINISH_TOOL}` cannot be called in the same step as tools waiting for input: "
    "call it once their results are in"
)


class StepInputs:
    """The requests for input of one session's steps."""

    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str,
        path: list[str],
        store: InputStore,
        writer: SessionWriter,
        tools: ToolRunner,
        hooks: RunHooks,
    ) -> None:
        self.agent = agent
        self.session_id = session_id
        self.path = path
        self.store = store
        self.writer = writer
        self.tools = tools
        self.hooks = hooks

    def ask(self, waiting: InputState, calls: list[ToolCall]) -> None:
        """Make a pending request of every call in ``calls`` that needs input, and log it.

        A finish call beside such calls gets an error result instead of ending the run:
        the output would come before the results it may depend on.
        """
        asked = False
        for call in calls:
            kind = self._kind(call)
            if kind is None:
                continue
            tool = self.agent.tool(call.name)
            timeout_s = tool.input_timeout_s if tool is not None else None
            request = Request(
                request_id=call.id,
                tool_name=call.name,
                kind=kind,
                deadline=None if timeout_s is None else time.time() + timeout_s,
            )
            waiting.pending[call.id] = request
            self.writer.emit(
                request_event(request, arguments_json=call.arguments_json, path=self.path)
            )
            self.hooks.on_input_required(request_id=call.id, tool_name=call.name, kind=kind)
            asked = True
        if asked:
            for call in calls:
                if call.name == FINISH_TOOL:
                    outcome = self.tools.answered(call, FINISH_WITH_INPUT, is_error=True)
                    waiting.results[call.id] = outcome.message

    def _kind(self, call: ToolCall) -> Any:
        tool = self.agent.tool(call.name)
        if tool is None or not (tool.client or tool.approval):
            return None
        try:
            args = tool.parse_args(call.arguments_json)
        except ToolArgumentError:
            # Bad arguments fail the call when it runs: nothing to approve. A client
            # tool has no server-side check to fail: the client gets the raw call.
            return "client_result" if tool.client else None
        return tool.input_kind(args)

    async def resolve(self, waiting: InputState, calls: list[ToolCall]) -> list[ToolCall]:
        """Apply the answers the store holds (and expire what is due); the calls to run
        now: those without a request, and the approved ones (recorded in ``waiting`` as
        handed to their tool, for the checkpoint the caller takes before they run)."""
        self._outcomes_unknown(waiting, calls)
        if not any(c.id in waiting.pending for c in calls):
            return [c for c in calls if c.id not in waiting.results]
        answers = await self.store.list_answers(self.session_id)
        now = time.time()
        ready: list[ToolCall] = []
        for call in calls:
            if call.id in waiting.results:
                continue
            request = waiting.pending.get(call.id)
            if request is None:
                ready.append(call)
                continue
            text = answers.get(call.id)
            if text is None and request.expired(now):
                text, _ = await self.store.put_answer(
                    self.session_id, call.id, Answer(expired=True).to_json()
                )
            if text is None:
                continue
            del waiting.pending[call.id]
            if self._apply(waiting, call, Answer.from_json(text)):
                waiting.approved.append(call.id)
                ready.append(call)
        return ready

    def _outcomes_unknown(self, waiting: InputState, calls: list[ToolCall]) -> None:
        """Approved calls a crash cut off while their tool ran: an error result each,
        never a second run."""
        for call in calls:
            if call.id in waiting.approved and call.id not in waiting.results:
                outcome = self.tools.answered(call, OUTCOME_UNKNOWN, is_error=True)
                waiting.results[call.id] = outcome.message

    def _apply(self, waiting: InputState, call: ToolCall, answer: Answer) -> bool:
        """Log ``answer`` to ``call``; True when the tool runs now (approved)."""
        self.writer.emit(answer.event(call.id))
        if answer.approved:
            return True
        tool = self.agent.tool(call.name)
        error = answer.error_result(call.name, tool.input_timeout_s if tool else None)
        if error is not None:
            outcome = self.tools.answered(call, error, is_error=True)
        else:
            outcome = self.tools.answered(call, answer.result_json or "null", is_error=False)
        waiting.results[call.id] = outcome.message
        return False


def suspended_event(waiting: InputState, blocked: int) -> pb.StreamEvent:
    """The ``suspended`` event of a session that stops running with ``waiting``."""
    return pb.StreamEvent(
        suspended=pb.Suspended(request_ids=list(waiting.pending), suspended_children=blocked)
    )
