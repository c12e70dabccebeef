"""An A2A task as a helix child's events: what the parent's log holds of it, and what
a task (a snapshot, or a snapshot moved on by live updates) adds to that.

A2A gives no sequence: a stream that breaks is resumed by ``SubscribeToTask``, which
starts with the task as it is now, or read with ``GetTask`` once the task is over. So
the events forwarded for an A2A child are a projection of the task, kept in step with
the parent's log by three cursors, each recoverable from the forwarded events alone
(``Cursor.note``), so a parent that restarts knows exactly what its log holds:

- the conversation (``Task.history`` then the current status message, in order):
  one event per message, the first user message as ``run_started``, an agent message
  as ``text_delta`` (or ``input_required`` when the task asks for input with it), a
  later user message (an answer) as ``input_answered``. Cursor: how many were
  forwarded.
- the artifacts: each new stretch of an artifact's parts as a ``tool_start`` /
  ``tool_end`` pair of the pseudo-tool ``artifact``, its call id
  ``{artifact_id}:{n}:{sequence}`` (``n``: the parts before it). Cursor: the parts forwarded, per artifact.
- the end: one terminal event (``completed`` after ``output``, ``failed``,
  ``interrupted``) once the task is in a terminal state. Cursor: whether it was.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from a2a.types import Artifact, Message, Part, Role, Task, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a.mapping import SESSION_STATUSES, TERMINAL_TASK_STATES, session_status

ARTIFACT_TOOL = "artifact"
"""The pseudo-tool whose calls carry an A2A child's artifacts in the parent's log."""
INPUT_TOOL = "a2a_input"
"""``InputRequired.tool_name`` of an A2A child's request for input (or for
authentication: both are answered by a follow-up message on the task)."""

PEER_SEQUENCE_KEY = "helix_peer_sequence"
"""Set (on the follower's own copy of a task) on an artifact last updated by a helix
peer's event: that event's sequence, kept with the artifact parts it forwards."""

ASKING_STATES = frozenset(
    state for state, status in SESSION_STATUSES.items() if status is SessionStatus.SUSPENDED
)
"""States in which the task waits for the client's next message (``mapping``)."""

_CONVERSATION_KINDS = frozenset({"run_started", "text_delta", "input_answered"})


@dataclasses.dataclass
class Cursor:
    """What the parent's log holds of one A2A child."""

    last_sequence: int = 0
    """The child's last forwarded sequence (0: none)."""
    messages: int = 0
    """Conversation messages forwarded."""
    parts: dict[str, int] = dataclasses.field(default_factory=dict)
    """Artifact parts forwarded, by artifact id."""
    request_id: str = ""
    """The last request for input forwarded ("" before any)."""
    answered: bool = False
    """``request_id``'s ``input_answered`` was forwarded."""
    said_at: int = 0
    """The newest status message forwarded, as the time of its event (nanoseconds):
    for an agent that keeps no history, which current status message is new."""
    said_id: str = ""
    """That message's id, when known (this run forwarded it, or it asked for input)."""
    peer_sequence: int = 0
    """For a helix peer (its events carry ``metadata.helix.sequence``): the last of its
    sequences applied, at least as far as the artifact parts forwarded say."""
    ended: bool = False
    """The child's terminal event was forwarded."""

    def note(self, event: pb.StreamEvent) -> None:
        """Count ``event``, one of the child's events as forwarded."""
        self.last_sequence = max(self.last_sequence, event.sequence)
        kind = event.WhichOneof("payload")
        if kind in ("text_delta", "input_required"):
            self.said_at = max(self.said_at, event.time.ToNanoseconds())
            self.said_id = event.input_required.request_id
        if kind in _CONVERSATION_KINDS:
            self.messages += 1
            if kind == "input_answered" and event.input_answered.request_id == self.request_id:
                self.answered = True
        elif kind == "input_required":
            self.request_id, self.answered = event.input_required.request_id, False
            if json.loads(event.input_required.arguments_json or "{}").get("message_id"):
                self.messages += 1
        elif kind == "tool_end" and event.tool_end.tool_name == ARTIFACT_TOOL:
            artifact_id, start, _ = event.tool_end.tool_call_id.rsplit(":", 2)
            result = json.loads(event.tool_end.result_json)
            self.parts[artifact_id] = int(start) + len(result.get("parts", []))
            self.peer_sequence = max(self.peer_sequence, int(result.get("peer_sequence", 0)))
        elif kind in ("completed", "failed", "interrupted", "terminated"):
            self.ended = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChildIdentity:
    """Who the projected events belong to."""

    session_id: str
    """The child's id in the parent's tree (``StreamEvent.session_id``)."""
    agent_type: str
    """What the parent calls the A2A agent (``StreamEvent.agent_type``)."""
    parent_session_id: str
    path: tuple[str, ...]
    """Session ids from the root down to the child (``InputRequired.path``)."""
    message: Message | None = None
    """The message the call sent (``run_started`` for an agent that keeps no history)."""


def conversation(task: Task) -> list[Message]:
    """The task's messages in order: its history, then its current status message
    (``a2a-sdk`` moves a status message into the history when the status changes)."""
    messages = list(task.history)
    if task.status.HasField("message"):
        current = task.status.message
        if not messages or messages[-1].message_id != current.message_id:
            messages.append(current)
    return messages


def project(task: Task, cursor: Cursor, child: ChildIdentity) -> list[pb.StreamEvent]:
    """The events ``task`` adds to what ``cursor`` says the log holds; ``cursor`` moves
    past them."""
    if cursor.ended:
        return []
    events: list[pb.StreamEvent] = []

    def add(at: Timestamp | None = None, **payload: Any) -> None:
        event = pb.StreamEvent(
            sequence=cursor.last_sequence + 1,
            session_id=child.session_id,
            agent_type=child.agent_type,
            **payload,
        )
        if at is not None and at.ToNanoseconds() > 0:
            event.time.CopyFrom(at)  # when the agent said it: the child's own clock
        else:
            event.time.GetCurrentTime()
        cursor.note(event)
        events.append(event)

    if keeps_history(task, child):
        _conversation(task, cursor, child, add)
    else:
        _current_status(task, cursor, child, add)
    if task.status.state in ASKING_STATES and not task.status.HasField("message"):
        request_id = f"{task.id}:input:{cursor.messages}"
        if cursor.request_id != request_id:
            add(input_required=_required(request_id, None, child))
            add(suspended=pb.Suspended(request_ids=[request_id]))
    for artifact in task.artifacts:
        _artifact(artifact, cursor, add)
    if task.status.state in TERMINAL_TASK_STATES:
        _end(task, add)
    return events


def keeps_history(task: Task, child: ChildIdentity) -> bool:
    """Whether the agent keeps the conversation in ``Task.history`` (A2A leaves it to
    the agent; ``a2a-sdk`` does): it starts with the call's own message."""
    if child.message is None:
        return True
    return bool(task.history) and task.history[0].message_id == child.message.message_id


def _conversation(task: Task, cursor: Cursor, child: ChildIdentity, add: Any) -> None:
    """The messages of the history past the cursor, and the current status message."""
    messages = conversation(task)
    asking = task.status.state in ASKING_STATES
    current = task.status.message.message_id if task.status.HasField("message") else None
    for index in range(cursor.messages, len(messages)):
        message = messages[index]
        at = task.status.timestamp if message.message_id == current else None
        if index == 0 and message.role == Role.ROLE_USER:
            add(
                run_started=pb.RunStarted(
                    input_json=message_json(message), parent_session_id=child.parent_session_id
                )
            )
        elif message.role == Role.ROLE_USER:
            add(input_answered=_answered(message, cursor.request_id))
        elif asking and index == len(messages) - 1 and message.message_id == current:
            add(at, input_required=_required(message.message_id, message, child))
            add(suspended=pb.Suspended(request_ids=[message.message_id]))
        else:
            add(at, text_delta=pb.TextDelta(text=message_text(message)))


def _current_status(task: Task, cursor: Cursor, child: ChildIdentity, add: Any) -> None:
    """An agent that keeps no history shows its current status message only: forwarded
    when newer than the last one forwarded (by its status timestamp). What it said in
    between, while no stream was open, is gone; so is how an answer went."""
    if cursor.messages == 0 and child.message is not None:
        run_started = pb.RunStarted(
            input_json=message_json(child.message), parent_session_id=child.parent_session_id
        )
        add(run_started=run_started)
    asking = task.status.state in ASKING_STATES
    if cursor.request_id and not cursor.answered and not asking:
        add(input_answered=pb.InputAnswered(request_id=cursor.request_id))
    if not task.status.HasField("message"):
        return
    stamp, message = task.status.timestamp, task.status.message
    said = stamp.ToNanoseconds()
    if message.message_id == cursor.said_id or (said and said < cursor.said_at):
        return
    if said and said == cursor.said_at and not cursor.said_id:
        return  # forwarded before a restart (its id is not in the log): the same one
    if asking:
        add(stamp, input_required=_required(message.message_id, message, child))
        add(suspended=pb.Suspended(request_ids=[message.message_id]))
    else:
        add(stamp, text_delta=pb.TextDelta(text=message_text(message)))
    cursor.said_id = message.message_id


def _artifact(artifact: Artifact, cursor: Cursor, add: Any) -> None:
    start = cursor.parts.get(artifact.artifact_id, 0)
    if len(artifact.parts) < start:  # replaced by a shorter one: all of it is new
        start = 0
    if len(artifact.parts) == start:
        return
    # Unique in the child's log even when a replaced artifact starts again at 0.
    call_id = f"{artifact.artifact_id}:{start}:{cursor.last_sequence + 1}"
    about = {"artifact_id": artifact.artifact_id, "name": artifact.name}
    add(
        tool_start=pb.ToolStart(
            tool_call_id=call_id, tool_name=ARTIFACT_TOOL, arguments_json=json.dumps(about)
        )
    )
    parts = [part_json(p) for p in artifact.parts[start:]]
    result: dict[str, Any] = {"parts": parts}
    if PEER_SEQUENCE_KEY in artifact.metadata:  # a helix peer's: where its log was
        result["peer_sequence"] = int(MessageToDict(artifact.metadata)[PEER_SEQUENCE_KEY])
    add(
        tool_end=pb.ToolEnd(
            tool_call_id=call_id, tool_name=ARTIFACT_TOOL, result_json=json.dumps(result)
        )
    )


def _end(task: Task, add: Any) -> None:
    usage = task_usage(task)
    status = session_status(task.status.state)
    said = message_text(task.status.message) if task.status.HasField("message") else ""
    if status is SessionStatus.COMPLETED:
        output_json = task_output_json(task)
        add(output=pb.Output(output_json=output_json))
        add(completed=pb.Completed(output_json=output_json, usage=usage, total_usage=usage))
    elif status is SessionStatus.INTERRUPTED:
        reason = said or "its A2A task was canceled"
        add(interrupted=pb.Interrupted(reason=reason, usage=usage, total_usage=usage))
    else:
        error = f"its A2A task is {state_name(task.status.state)}" + (f": {said}" if said else "")
        reason = f"a2a_{state_name(task.status.state).replace('-', '_')}"
        add(failed=pb.Failed(error=error, failure_reason=reason, usage=usage, total_usage=usage))


def state_name(state: int) -> str:
    """``input-required`` for ``TASK_STATE_INPUT_REQUIRED`` (A2A's own spelling)."""
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")


def _required(request_id: str, message: Message | None, child: ChildIdentity) -> pb.InputRequired:
    """The request for input an asking task makes. An approval when the question's
    data says so: ``{"kind": "approval"}``, or one pending request of that kind (a
    helix service's own ``input-required``, ``mapping.pending_data``)."""
    asked: dict[str, Any] = {}
    if message is not None:
        texts = [p.text for p in message.parts if p.WhichOneof("content") == "text"]
        asked = {"message_id": message.message_id, "question": "".join(texts)}
        data = [MessageToDict(p.data) for p in message.parts if p.HasField("data")]
        if data:
            asked["data"] = data[0] if len(data) == 1 else data
    kind = pb.INPUT_KIND_CLIENT_RESULT
    found: Any = asked.get("data")
    for data in found if isinstance(found, list) else [found]:
        if isinstance(data, dict) and _asks_approval(data):
            kind = pb.INPUT_KIND_APPROVAL
    return pb.InputRequired(
        request_id=request_id,
        tool_name=INPUT_TOOL,
        arguments_json=json.dumps(asked),
        kind=kind,
        path=[*child.path],
    )


def _asks_approval(data: dict[str, Any]) -> bool:
    pending = data.get("input_required")
    if isinstance(pending, list) and len(pending) == 1 and isinstance(pending[0], dict):
        data = pending[0]  # a helix service's own request (mapping.pending_data)
    return data.get("kind") == "approval"


def _answered(message: Message, request_id: str) -> pb.InputAnswered:
    data = next((MessageToDict(p.data) for p in message.parts if p.HasField("data")), None)
    if isinstance(data, dict) and isinstance(data.get("approved"), bool):
        outcome = pb.INPUT_OUTCOME_APPROVED if data["approved"] else pb.INPUT_OUTCOME_DENIED
        return pb.InputAnswered(
            request_id=request_id, outcome=outcome, reason=str(data.get("reason", ""))
        )
    if isinstance(data, dict) and "error" in data:
        return pb.InputAnswered(
            request_id=request_id, outcome=pb.INPUT_OUTCOME_ERROR, reason=str(data["error"])
        )
    return pb.InputAnswered(request_id=request_id, outcome=pb.INPUT_OUTCOME_RESULT)


def part_json(part: Part) -> Any:
    """A part as JSON: its text, its data, or a description of a file."""
    if part.HasField("data"):
        return MessageToDict(part.data)
    which = part.WhichOneof("content")
    if which == "text":
        return part.text
    return {"file": part.filename or part.url, "media_type": part.media_type}


def message_text(message: Message) -> str:
    """A message's text parts, joined (its data parts as JSON when it has no text)."""
    texts = [p.text for p in message.parts if p.WhichOneof("content") == "text"]
    if texts:
        return "".join(texts)
    return " ".join(json.dumps(part_json(p)) for p in message.parts)


def message_json(message: Message) -> str:
    """A message's content as one JSON value: its one data part, or its text."""
    return _one_value(message.parts)


def task_output_json(task: Task) -> str:
    """A completed task's output as JSON: its artifacts' one data part, or their text
    joined; without artifacts, its final status message's."""
    parts = [p for a in task.artifacts for p in a.parts]
    if not parts and task.status.HasField("message"):
        parts = list(task.status.message.parts)
    return _one_value(parts)


def _one_value(parts: Iterable[Part]) -> str:
    parts = list(parts)
    data = [p for p in parts if p.HasField("data")]
    if len(data) == 1:
        return json.dumps(MessageToDict(data[0].data))
    texts = [p.text for p in parts if p.WhichOneof("content") == "text"]
    if texts and not data:
        return json.dumps("".join(texts))
    return json.dumps([part_json(p) for p in parts])


def task_usage(task: Task) -> pb.TokenUsage:
    """The token usage an agent reports in its task's metadata (``usage``, with
    ``prompt_tokens``/``completion_tokens``/``total_tokens`` or ``input_tokens``/
    ``output_tokens``); zero when it reports none."""
    raw = MessageToDict(task.metadata).get("usage") if task.HasField("metadata") else None
    if not isinstance(raw, dict):
        return pb.TokenUsage()
    prompt = int(raw.get("prompt_tokens", raw.get("input_tokens", 0)) or 0)
    completion = int(raw.get("completion_tokens", raw.get("output_tokens", 0)) or 0)
    total = int(raw.get("total_tokens", prompt + completion) or 0)
    return pb.TokenUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)
