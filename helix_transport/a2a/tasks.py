"""A2A tasks as views of helix sessions: ids, a message as an input, a task from a log.

A conversation (A2A ``contextId``) is one helix session; its first turn is the task
whose id is the session id, each ``Continue`` turn ``n`` the task ``<session id>~n``
(``~`` is outside the session id alphabet, so no session id reads as a turn).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf import json_format

from helix_transport._events import TERMINAL_KINDS, SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a import mapping
from helix_transport.agent.definition import Agent
from helix_transport.tree import PendingRequest, SessionTree

TURN_SEPARATOR = "~"


def task_id(session_id: str, turn: int = 1) -> str:
    """The A2A task id of turn ``turn`` of session ``session_id``."""
    return session_id if turn <= 1 else f"{session_id}{TURN_SEPARATOR}{turn}"


def split_task_id(value: str) -> tuple[str, int]:
    """``(session_id, turn)`` of a task id; a malformed one is not found, as an unknown
    one is (no hint of what exists)."""
    session_id, separator, turn = value.partition(TURN_SEPARATOR)
    if not separator:
        return session_id, 1
    if not turn.isdigit() or int(turn) < 2:
        raise TaskNotFoundError()
    return session_id, int(turn)


def session_id_for(message_id: str) -> str:
    """The session a new task's message starts: derived from its ``messageId``, so a
    client that sends the same message again gets the same task, not a second run."""
    return "a2a-" + hashlib.sha256(message_id.encode()).hexdigest()[:32]


def message_input(message: a2a.Message, agent: Agent) -> tuple[str, bool]:
    """The input a message carries and whether it is structured: its first data part
    (a JSON object), else its text, fitted to the agent's input schema.

    Text fits a schema with one string property (required, or the only one) as that
    property's value; otherwise it must be a JSON object.

    Raises:
        InvalidParamsError: no input, or text that fits no field; ``data.field`` names it.
    """
    for part in message.parts:
        if part.HasField("data"):
            value = json_format.MessageToDict(part.data)
            if not isinstance(value, dict):
                raise _invalid("message.parts.data", "must be a JSON object (the agent's input)")
            return json.dumps(value), True
    text = "".join(part.text for part in message.parts if part.HasField("text"))
    if not text:
        raise _invalid("message.parts", "needs a data part or a text part")
    field = text_field(agent)
    if field is not None:
        return json.dumps({field: text}), False
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _invalid(
            "message.parts.text",
            "the agent's input has no single text field: send a data part (or a JSON object)",
        )
    return text, False


def text_field(agent: Agent) -> str | None:
    """The input field a plain text fills: the one string property of the schema that
    is required (or the only property), else ``None``."""
    schema: dict[str, Any] = json.loads(agent.input_schema_json())
    properties: dict[str, Any] = schema.get("properties", {})
    strings = [name for name, spec in properties.items() if spec.get("type") == "string"]
    required = [name for name in schema.get("required", []) if name in strings]
    if len(required) == 1:
        return str(required[0])
    if len(properties) == 1 and strings:
        return str(strings[0])
    return None


def _invalid(field: str, problem: str) -> InvalidParamsError:
    return InvalidParamsError(f"{field}: {problem}", data={"field": field, "problem": problem})


def turn_events(events: Sequence[pb.StreamEvent], turn: int) -> list[pb.StreamEvent]:
    """The events of turn ``turn`` of a session's log (from its ``turn_started``, or the
    start, to its end).

    Raises:
        TaskNotFoundError: the log has no such turn.
    """
    start = 0
    if turn > 1:
        found = [
            n
            for n, event in enumerate(events)
            if event.WhichOneof("payload") == "turn_started" and event.turn_started.turn == turn
        ]
        if not found:
            raise TaskNotFoundError()
        start = found[0]
    end = len(events)
    for n in range(start + 1, len(events)):
        if events[n].WhichOneof("payload") == "turn_started":
            end = n
            break
    return list(events[start:end])


def turn_count(events: Sequence[pb.StreamEvent]) -> int:
    """The number of the session's latest turn."""
    turns = [e.turn_started.turn for e in events if e.WhichOneof("payload") == "turn_started"]
    return max(turns, default=1)


def text_started(events: Sequence[pb.StreamEvent], through: int) -> bool:
    """Whether a turn's ``events`` began its ``text`` artifact by sequence ``through``
    (a stream that follows from there appends to it)."""
    return any(e.sequence <= through and mapping.is_text(e) for e in events)


def pending_requests(events: Sequence[pb.StreamEvent]) -> list[PendingRequest]:
    """Every request for input waiting in the tree, folded from the root's log."""
    tree = SessionTree()
    for event in events:
        tree.add(event)
    return tree.pending_requests()


def build_task(
    *,
    task: str,
    context_id: str,
    events: Sequence[pb.StreamEvent],
    status: SessionStatus,
    pending: Sequence[PendingRequest] = (),
) -> a2a.Task:
    """The task ``task`` (of conversation ``context_id``) as the events of its turn
    show it; ``status`` is the session's now (its turn being the latest) and decides
    unless the turn logged its end."""
    result = a2a.Task(id=task, context_id=context_id)
    last = events[-1] if events else None
    ended = last is not None and last.WhichOneof("payload") in TERMINAL_KINDS
    if ended and last is not None:
        result.status.CopyFrom(mapping.status_of_event(last))
    else:
        result.status.state = mapping.task_state(status)
        if status is SessionStatus.SUSPENDED:
            part = a2a.Part()
            part.data.struct_value.update(mapping.pending_data(pending))
            result.status.message.role = a2a.ROLE_AGENT
            result.status.message.parts.append(part)
        if last is not None and last.HasField("time"):
            result.status.timestamp.CopyFrom(last.time)
    if result.status.HasField("message"):
        result.status.message.message_id = mapping.message_id(task, last.sequence if last else 0)
        result.status.message.task_id = task
        result.status.message.context_id = context_id
    for event in events:
        if event.WhichOneof("payload") == "output":
            artifact = result.artifacts.add(
                artifact_id=mapping.OUTPUT_ARTIFACT, name=mapping.OUTPUT_ARTIFACT
            )
            artifact.parts.append(mapping.json_part(event.output.output_json))
    sequence = last.sequence if last is not None else 0
    result.metadata.update(
        {mapping.METADATA_KEY: {"session_id": context_id, "last_sequence": sequence}}
    )
    return result
