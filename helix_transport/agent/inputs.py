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
from dataclasses import dataclass, field
from typing import Any, Literal

from helix_transport._exceptions import InvalidArgument
from helix_transport._metadata import SESSION_PATH_KEY
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.state import RunState
from helix_transport.agent.tools import FINISH_TOOL

EXTENSION = "inputs"
"""The run state's extension (``RunState.extensions``) that holds ``InputState``."""

Kind = Literal["approval", "client_result"]
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


@dataclass(kw_only=True)
class Request:
    """One pending request of this session."""

    request_id: str
    tool_name: str
    kind: Kind
    deadline: float | None = None
    """Epoch seconds past which it expires; ``None``: never."""

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tool_name": self.tool_name,
            "kind": self.kind,
            "deadline": self.deadline,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Request:
        kind: Kind = "client_result" if raw.get("kind") == "client_result" else "approval"
        deadline = raw.get("deadline")
        return cls(
            request_id=str(raw["request_id"]),
            tool_name=str(raw.get("tool_name", "")),
            kind=kind,
            deadline=None if deadline is None else float(deadline),
        )

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass(kw_only=True)
class WaitingChild:
    """A child a suspended session waits for: where it is, and how far the session's
    log has followed it (a child whose log went past that has moved on)."""

    child_session_id: str
    address: str
    last_sequence: int

    def to_json(self) -> dict[str, Any]:
        return {
            "child_session_id": self.child_session_id,
            "address": self.address,
            "last_sequence": self.last_sequence,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WaitingChild:
        return cls(
            child_session_id=str(raw["child_session_id"]),
            address=str(raw.get("address", "")),
            last_sequence=int(raw.get("last_sequence", 0)),
        )


@dataclass(kw_only=True)
class InputState:
    """What a step waiting for input keeps in its checkpoint."""

    pending: dict[str, Request] = field(default_factory=dict)
    """This session's own unanswered requests, by request id."""
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The tool messages of the step's calls that have finished, by call id: a resumed
    step runs only the others."""
    approved: list[str] = field(default_factory=list)
    """Approved calls handed to their tool: checkpointed before the tool runs, so a run
    resumed after a crash never runs an approved tool twice (at most once: a call still
    here without a result gets an error saying its outcome is unknown)."""
    output_json: str | None = None
    """The finish tool's valid output, when it ran in a step that then waited (for a
    suspended child): the step ends the run once the rest is in."""
    children: list[WaitingChild] = field(default_factory=list)
    """The suspended children the session waited for when it suspended."""
    suspended_at: float | None = None
    """When it suspended (epoch seconds); ``None`` while it runs."""

    @classmethod
    def of(cls, run: RunState) -> InputState:
        raw = run.extensions.get(EXTENSION) or {}
        return cls(
            pending={r["request_id"]: Request.from_json(r) for r in raw.get("pending", ())},
            results=dict(raw.get("results") or {}),
            approved=list(raw.get("approved") or ()),
            output_json=raw.get("output_json"),
            children=[WaitingChild.from_json(c) for c in raw.get("children", ())],
            suspended_at=raw.get("suspended_at"),
        )

    def save(self, run: RunState) -> None:
        """Write this state into ``run`` (dropped when there is nothing to keep)."""
        if not (
            self.pending
            or self.results
            or self.approved
            or self.children
            or self.suspended_at
            or self.output_json is not None
        ):
            run.extensions.pop(EXTENSION, None)
            return
        run.extensions[EXTENSION] = {
            "pending": [r.to_json() for r in self.pending.values()],
            "results": self.results,
            "approved": self.approved,
            "output_json": self.output_json,
            "children": [c.to_json() for c in self.children],
            "suspended_at": self.suspended_at,
        }

    def only(self, call_ids: set[str]) -> None:
        """Forget what is not about ``call_ids`` (the step's calls): what an earlier step,
        cut off by an interrupt, kept is over."""
        self.pending = {k: v for k, v in self.pending.items() if k in call_ids}
        self.results = {k: v for k, v in self.results.items() if k in call_ids}
        self.approved = [k for k in self.approved if k in call_ids]
        if not any(r.get("name") == FINISH_TOOL for r in self.results.values()):
            self.output_json = None


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


def session_path(metadata: dict[str, str], own_id: str) -> list[str]:
    """The session ids from the root down to this session (``own_id`` last)."""
    try:
        above = json.loads(metadata.get(SESSION_PATH_KEY, "[]"))
    except ValueError:
        above = []
    if not isinstance(above, list):
        above = []
    return [*(str(s) for s in above), own_id]
