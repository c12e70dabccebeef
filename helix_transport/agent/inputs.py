"""Input from people: the requests a run waits for, the answers it gets, and what it
keeps while it waits.

A tool call that needs an approval, or a client tool's result, is a *request*: its id
is the tool call's id. The run logs ``input_required`` for it in the same write as the
step's checkpoint, which lists it as pending (``InputState``), so a request a client
can see is always one the store knows. Answers live in the store (``InputStore``),
written by ``SubmitInput``, never in memory: a run reads them when it reaches the
step, applies each once (``input_answered``), and keeps the step's finished calls'
results here until every call of the step has one. A step that still waits when
nothing else runs suspends: the session is a row until an answer, a deadline or an
interrupt wakes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from helix_transport._exceptions import InvalidArgument
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.state import InputState, Kind, Request, WaitingChild
from helix_transport.agent.tools import FINISH_TOOL

# The records a run keeps while it waits live with the run state (``RunState.inputs``).
__all__ = [
    "KINDS",
    "Answer",
    "InputState",
    "Kind",
    "Request",
    "WaitingChild",
    "only",
    "request_event",
]

KINDS: dict[str, pb.InputKind.ValueType] = {
    "approval": pb.INPUT_KIND_APPROVAL,
    "client_result": pb.INPUT_KIND_CLIENT_RESULT,
}


@dataclass(frozen=True, kw_only=True)
class Answer:
    """An answer to one request, as ``SubmitInput`` gives it or a deadline makes it."""

    approved: bool | None = None
    """For an approval: whether the tool runs."""
    reason: str = ""
    """Why (an approval's or a denial's), for the model and the log."""
    result_json: str | None = None
    """A client tool's result."""
    error: str | None = None
    """A client tool's failure."""
    expired: bool = False
    """No answer came before the request's deadline."""

    @property
    def kind(self) -> Kind:
        return "approval" if self.approved is not None else "client_result"

    def to_json(self) -> str:
        """The answer as the store keeps it."""
        if self.expired:
            return json.dumps({"expired": True})
        if self.approved is not None:
            return json.dumps({"approved": self.approved, "reason": self.reason})
        if self.error is not None:
            return json.dumps({"error": self.error})
        return json.dumps({"result_json": self.result_json})

    @classmethod
    def from_json(cls, text: str) -> Answer:
        raw = json.loads(text)
        if raw.get("expired"):
            return cls(expired=True)
        if "approved" in raw:
            return cls(approved=bool(raw["approved"]), reason=str(raw.get("reason", "")))
        if "error" in raw:
            return cls(error=str(raw["error"]))
        return cls(result_json=str(raw.get("result_json", "null")))

    @classmethod
    def from_request(cls, request: pb.SubmitInputRequest) -> Answer:
        """The answer a ``SubmitInput`` carries.

        Raises:
            InvalidArgument: no answer, or a result that is not JSON.
        """
        which = request.WhichOneof("answer")
        if which == "approval":
            return cls(approved=request.approval.approved, reason=request.approval.reason)
        if which == "result":
            if request.result.error:
                return cls(error=request.result.error)
            try:
                json.loads(request.result.result_json)
            except ValueError:
                raise InvalidArgument("result.result_json", "not valid JSON") from None
            return cls(result_json=request.result.result_json)
        raise InvalidArgument("answer", "set approval or result")

    def outcome(self) -> pb.InputOutcome.ValueType:
        if self.expired:
            return pb.INPUT_OUTCOME_EXPIRED
        if self.approved is not None:
            return pb.INPUT_OUTCOME_APPROVED if self.approved else pb.INPUT_OUTCOME_DENIED
        return pb.INPUT_OUTCOME_ERROR if self.error is not None else pb.INPUT_OUTCOME_RESULT

    def event(self, request_id: str) -> pb.StreamEvent:
        """The ``input_answered`` event that applies this answer."""
        reason = self.reason if self.approved is not None else self.error or ""
        return pb.StreamEvent(
            input_answered=pb.InputAnswered(
                request_id=request_id, outcome=self.outcome(), reason=reason
            )
        )

    def error_result(self, tool_name: str, timeout_s: float | None) -> str | None:
        """The error result the model sees instead of the tool's; ``None`` when the tool
        runs (approved) or its result is the answer (a client result)."""
        if self.expired:
            waited = f" within {timeout_s:g}s" if timeout_s else ""
            return f"no answer to {tool_name!r}{waited}: the request expired"
        if self.approved is False:
            return f"{tool_name!r} was denied" + (f": {self.reason}" if self.reason else "")
        if self.error is not None:
            return self.error
        return None


def only(waiting: InputState, call_ids: set[str]) -> None:
    """Forget what ``waiting`` holds that is not about ``call_ids`` (the step's calls):
    what an earlier step, cut off by an interrupt, kept is over."""
    waiting.pending = {k: v for k, v in waiting.pending.items() if k in call_ids}
    waiting.results = {k: v for k, v in waiting.results.items() if k in call_ids}
    waiting.started = [k for k in waiting.started if k in call_ids]
    if not any(r.get("name") == FINISH_TOOL for r in waiting.results.values()):
        waiting.output_json = None


def request_event(request: Request, *, arguments_json: str, path: list[str]) -> pb.StreamEvent:
    """The ``input_required`` event of ``request``."""
    event = pb.StreamEvent(
        input_required=pb.InputRequired(
            request_id=request.request_id,
            tool_name=request.tool_name,
            arguments_json=arguments_json,
            kind=KINDS[request.kind],
            path=path,
        )
    )
    if request.deadline is not None:
        event.input_required.deadline.FromNanoseconds(int(request.deadline * 1e9))
    return event
