"""A step's requests for input: asked once, answered from the store, applied once.

``ask`` runs when the model's calls are known, before the step's checkpoint: each call
that needs an approval or a client's result becomes a pending request and an
``input_required`` event in that same write. ``resolve`` runs each time the step runs
(first, and after every resume): it reads the answers the store holds, expires what
passed its deadline (as an answer of its own, stored the same way, so an answer and a
deadline racing end one way only), logs ``input_answered`` for each, and says which
calls run now. The rest wait; the loop suspends when nothing else runs.

The same two moments keep calls at most once (``InputState.started``): ``ask`` marks
the calls of ``once`` tools as started in that first checkpoint, ``resolve`` marks
approved calls in the checkpoint it asks for before they run. A resumed step finds a
call marked but without a result: it takes the result the call's run logged, or tells
the model the outcome is unknown; it never runs the call again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._tool_runner import ToolRunner
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import RunHooks
from helix_transport.agent.inputs import Answer, InputState, Request, request_event
from helix_transport.agent.model import ToolCall
from helix_transport.agent.state import OUTCOME_UNKNOWN
from helix_transport.agent.tools import FINISH_TOOL, ToolArgumentError
from helix_transport.log import SessionWriter
from helix_transport.store import Store, pages

logger = logging.getLogger("helix.loop")

OUTCOME_UNKNOWN_CODE = "outcome_unknown"
"""The ``Error.code`` logged beside such a call's result, for operators."""
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
        store: Store,
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
        self._marked: set[str] = set()
        """Calls this run marked as started (``ask``): they run now, not cut off."""

    def ask(self, waiting: InputState, calls: list[ToolCall]) -> None:
        """Make a pending request of every call in ``calls`` that needs input, and log it.

        A finish call beside such calls gets an error result instead of ending the run:
        the output would come before the results it may depend on.
        """
        asked = False
        for call in calls:
            kind = self._kind(call)
            if kind is None:
                if self._once(call):  # started, in the checkpoint taken before it runs
                    waiting.started.append(call.id)
                    self._marked.add(call.id)
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

    def _once(self, call: ToolCall) -> bool:
        """A call of a ``once`` tool with valid arguments (invalid ones never run it)."""
        tool = self.agent.tool(call.name)
        if tool is None or tool.once is not True:
            return False
        try:
            tool.parse_args(call.arguments_json)
        except ToolArgumentError:
            return False
        return True

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

    async def resolve(
        self, waiting: InputState, calls: list[ToolCall], *, from_sequence: int
    ) -> list[ToolCall]:
        """Apply the answers the store holds (and expire what is due); the calls to run
        now: those without a request, and the approved ones (recorded in ``waiting`` as
        handed to their tool, for the checkpoint the caller takes before they run).

        ``from_sequence`` is where the log ended at the checkpoint the run began from:
        what a crash cut off was logged after it.
        """
        await self._cut_off(waiting, calls, from_sequence)
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
                waiting.started.append(call.id)
                ready.append(call)
        return ready

    async def _cut_off(
        self, waiting: InputState, calls: list[ToolCall], from_sequence: int
    ) -> None:
        """At-most-once calls a crash cut off (started by an earlier run, no result in
        the checkpoint): the result their run logged when it returned, else an error
        result saying the outcome is unknown. Never a second run."""
        lost = [
            c
            for c in calls
            if c.id in waiting.started and c.id not in waiting.results and c.id not in self._marked
        ]
        if not lost:
            return
        logged = await self._logged_results({c.id for c in lost}, from_sequence)
        for call in lost:
            end = logged.get(call.id)
            if end is not None:  # its events are in the log already: not logged again
                waiting.results[call.id] = {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.name,
                    "content": end.result_json,
                }
                continue
            logger.warning(
                "session %s: the outcome of %s call %s is unknown (cut off by a crash; "
                "not run again)",
                self.session_id,
                call.name,
                call.id,
                extra={"tool_call_id": call.id, "code": OUTCOME_UNKNOWN_CODE},
            )
            problem = f"{call.name} call {call.id}: {OUTCOME_UNKNOWN}"
            self.writer.emit(
                pb.StreamEvent(error=pb.Error(message=problem, code=OUTCOME_UNKNOWN_CODE))
            )
            outcome = self.tools.answered(call, OUTCOME_UNKNOWN, is_error=True)
            waiting.results[call.id] = outcome.message

    async def _logged_results(
        self, call_ids: set[str], from_sequence: int
    ) -> dict[str, pb.ToolEnd]:
        """The first ``tool_end`` of each of ``call_ids`` after ``from_sequence``."""
        found: dict[str, pb.ToolEnd] = {}
        async for events in pages(self.store, self.session_id, from_sequence=from_sequence):
            for event in events:
                if event.WhichOneof("payload") != "tool_end":
                    continue
                call_id = event.tool_end.tool_call_id
                if call_id in call_ids and call_id not in found:
                    found[call_id] = event.tool_end
        return found

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
