"""The one table between helix sessions and A2A tasks: states, events, input-required.

Both directions read it: serving (a helix session shown as an A2A task) and the
child direction (an A2A task followed as a helix child). Nothing else in the package
decides what an A2A state means.

==========================  ==============================  =========================
helix                       A2A                             notes
==========================  ==============================  =========================
``SessionStatus.RUNNING``   ``TASK_STATE_WORKING``          also SUBMITTED, inbound
``SUSPENDED``               ``TASK_STATE_INPUT_REQUIRED``   the pending requests are
                                                            the status message's data
``COMPLETED``               ``TASK_STATE_COMPLETED``        output: artifact "output"
``FAILED``                  ``TASK_STATE_FAILED``           also REJECTED, inbound
``INTERRUPTED``             ``TASK_STATE_CANCELED``         CancelTask = Interrupt
``TERMINATED``              ``TASK_STATE_CANCELED``         (abort); ``helix.kind`` tells
(none)                      ``TASK_STATE_AUTH_REQUIRED``    inbound: SUSPENDED
==========================  ==============================  =========================

Every helix event becomes one A2A stream event, carrying in its metadata
``{"helix": {"sequence": n, "kind": k, "session_id": s, "path": [...]}}``: the
root log's ``sequence`` (the resume point), the innermost event's kind and session,
and the session ids from the root down to it (for a forwarded ``ChildEvent``).
Except: consecutive top-level ``text_delta`` events already in hand together (a
reader behind the writer) become ONE ``text`` artifact update, their text joined,
``sequence`` the last one covered and ``first_sequence`` the first (present only when
it covers more than one).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from a2a.types import a2a_pb2 as a2a
from google.protobuf import json_format, struct_pb2

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.tree import PendingRequest

METADATA_KEY = "helix"
"""The key of helix's own fields in A2A ``metadata`` (events, tasks, messages)."""

OUTPUT_ARTIFACT = "output"
"""The artifact id (and name) of a session's output."""
TEXT_ARTIFACT = "text"
"""The artifact id of the model text the root streams (``text_delta``), appended."""

TASK_STATES: Mapping[SessionStatus, a2a.TaskState] = {
    SessionStatus.RUNNING: a2a.TASK_STATE_WORKING,
    SessionStatus.SUSPENDED: a2a.TASK_STATE_INPUT_REQUIRED,
    SessionStatus.COMPLETED: a2a.TASK_STATE_COMPLETED,
    SessionStatus.FAILED: a2a.TASK_STATE_FAILED,
    SessionStatus.INTERRUPTED: a2a.TASK_STATE_CANCELED,
    SessionStatus.TERMINATED: a2a.TASK_STATE_CANCELED,
}
"""A helix session's status as an A2A task state."""

SESSION_STATUSES: Mapping[a2a.TaskState, SessionStatus] = {
    a2a.TASK_STATE_SUBMITTED: SessionStatus.RUNNING,
    a2a.TASK_STATE_WORKING: SessionStatus.RUNNING,
    a2a.TASK_STATE_INPUT_REQUIRED: SessionStatus.SUSPENDED,
    a2a.TASK_STATE_AUTH_REQUIRED: SessionStatus.SUSPENDED,
    a2a.TASK_STATE_COMPLETED: SessionStatus.COMPLETED,
    a2a.TASK_STATE_FAILED: SessionStatus.FAILED,
    a2a.TASK_STATE_REJECTED: SessionStatus.FAILED,
    a2a.TASK_STATE_CANCELED: SessionStatus.INTERRUPTED,
}
"""An A2A task state as a helix session status (``TASK_STATE_UNSPECIFIED``: none)."""

TERMINAL_TASK_STATES = frozenset(
    state for state, status in SESSION_STATUSES.items() if status.is_terminal
)
"""The A2A states after which a task changes no more."""

_TERMINAL_STATUS = {
    "completed": SessionStatus.COMPLETED,
    "failed": SessionStatus.FAILED,
    "interrupted": SessionStatus.INTERRUPTED,
    "terminated": SessionStatus.TERMINATED,
}


def task_state(status: SessionStatus) -> a2a.TaskState:
    """The A2A state of a session in ``status``."""
    return TASK_STATES[status]


def session_status(state: a2a.TaskState) -> SessionStatus | None:
    """The helix status of an A2A task in ``state``; ``None`` for an unspecified one."""
    return SESSION_STATUSES.get(state)


def struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    """``value`` (JSON values) as a protobuf ``Struct``."""
    result = struct_pb2.Struct()
    result.update(value)
    return result


def helix_metadata(event: pb.StreamEvent) -> dict[str, Any]:
    """The ``helix`` metadata of ``event`` (a root log's event): its sequence, and the
    kind, session and path of the innermost event it wraps."""
    path = [event.session_id]
    inner = event
    while inner.WhichOneof("payload") == "child_event":
        inner = inner.child_event.event
        path.append(inner.session_id)
    return {
        "sequence": event.sequence,
        "kind": inner.WhichOneof("payload") or "",
        "session_id": inner.session_id,
        "path": path,
    }


def event_data(event: pb.StreamEvent) -> dict[str, Any]:
    """The helix event as JSON (proto field names): the data part that carries it whole."""
    return json_format.MessageToDict(event, preserving_proto_field_name=True)


def pending_data(requests: Iterable[PendingRequest]) -> dict[str, Any]:
    """The data part of an ``input-required`` status: every request waiting in the tree.

    A client answers one by sending, on the same task, a message whose data part is
    ``{"request_id": ..., "approved": true|false, "reason": ...}`` (an approval) or
    ``{"request_id": ..., "result": <JSON>}`` / ``{"request_id": ..., "error": "..."}``
    (a client tool's result); ``path`` may be given, else the request's own is used.
    """
    return {"input_required": [request.to_json() for request in requests]}


def answer_request(
    data: Mapping[str, Any], pending: Sequence[PendingRequest]
) -> tuple[PendingRequest, pb.SubmitInputRequest]:
    """The ``SubmitInputRequest`` a client's answer (``data``, see ``pending_data``) makes
    for one of ``pending``, and the request it answers.

    With one request pending ``request_id`` may be left out.

    Raises:
        ValueError: ``(field, problem)`` as its args: no such request, or no answer.
    """
    request_id = data.get("request_id")
    if request_id is None and len(pending) == 1:
        request_id = pending[0].request_id
    found = [p for p in pending if p.request_id == request_id]
    if not isinstance(request_id, str) or not found:
        raise ValueError("request_id", "names no request this task waits for")
    asked = found[0]
    request = pb.SubmitInputRequest(
        session_id=asked.path[0] if asked.path else asked.session_id,
        request_id=asked.request_id,
        path=list(asked.path),
    )
    if "approved" in data:
        if not isinstance(data["approved"], bool):
            raise ValueError("approved", "must be true or false")
        request.approval.approved = data["approved"]
        request.approval.reason = str(data.get("reason", ""))
    elif "error" in data:
        request.result.error = str(data["error"])
    elif "result" in data:
        request.result.result_json = json.dumps(data["result"])
    else:
        raise ValueError("approved", "an answer needs 'approved', 'result' or 'error'")
    return asked, request


def message_id(task_id: str, sequence: int) -> str:
    """The A2A message id of the status message for the event at ``sequence``: the
    same on every replay, so a client can drop what it has seen."""
    return f"{task_id}:{sequence}"


def is_text(event: pb.StreamEvent) -> bool:
    """Whether ``event`` is a top-level ``text_delta`` (the ``text`` artifact's)."""
    return event.WhichOneof("payload") == "text_delta"


TEXT_RUN_CHARS = 65_536
"""A run of joined text deltas stops once its text is this long (one SSE event each:
a replay of a long answer is several updates, not one huge one)."""


def runs(events: Sequence[pb.StreamEvent]) -> Iterator[Sequence[pb.StreamEvent]]:
    """``events`` (consecutive in the log) cut into what becomes one update each: a run
    of consecutive top-level text deltas (up to ``TEXT_RUN_CHARS``), or one other
    event; in order."""
    start = 0
    count = len(events)
    while start < count:
        end = start + 1
        if is_text(events[start]):
            size = len(events[start].text_delta.text)
            while end < count and size < TEXT_RUN_CHARS and is_text(events[end]):
                size += len(events[end].text_delta.text)
                end += 1
        yield events[start:end]
        start = end


def text_update(
    run: Sequence[pb.StreamEvent], *, task_id: str, context_id: str, append: bool
) -> a2a.TaskArtifactUpdateEvent:
    """ONE ``text`` artifact update for ``run``, consecutive top-level text deltas.

    ``append`` is False for the artifact's first chunk (the client does not have the
    artifact yet). Built directly: a reader that keeps up gets one per delta, so no
    event walk (``helix_metadata``) for what is known.
    """
    last = run[-1]
    helix: dict[str, Any] = {
        "sequence": last.sequence,
        "kind": "text_delta",
        "session_id": last.session_id,
        "path": [last.session_id],
    }
    if len(run) > 1:
        helix["first_sequence"] = run[0].sequence
    text = last.text_delta.text if len(run) == 1 else "".join(e.text_delta.text for e in run)
    update = a2a.TaskArtifactUpdateEvent(task_id=task_id, context_id=context_id, append=append)
    update.artifact.artifact_id = TEXT_ARTIFACT
    update.artifact.name = TEXT_ARTIFACT
    update.artifact.parts.add(text=text)
    update.metadata.update({METADATA_KEY: helix})
    return update


def covered(update: a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent) -> tuple[int, int]:
    """``(first, last)``: the sequences of the root's log an update of ours covers."""
    helix = update.metadata.fields[METADATA_KEY].struct_value.fields
    last = int(helix["sequence"].number_value)
    first = helix["first_sequence"].number_value if "first_sequence" in helix else last
    return int(first), last


def stream_event(
    event: pb.StreamEvent,
    *,
    task_id: str,
    context_id: str,
    pending: Sequence[PendingRequest] = (),
    append: bool = True,
) -> a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent:
    """The A2A stream event of one event of the root session's log.

    ``output`` is the ``output`` artifact; a top-level ``text_delta`` is a chunk of
    the ``text`` artifact (``append``: not its first, see ``text_update``);
    ``suspended`` is ``input-required`` with ``pending`` as its message's data; a
    terminal event is the final state; every other event (the children's,
    forwarded, too) is a ``working`` status whose message's data part is the helix
    event whole.
    """
    kind = event.WhichOneof("payload")
    if kind == "text_delta":
        return text_update([event], task_id=task_id, context_id=context_id, append=append)
    metadata = struct({METADATA_KEY: helix_metadata(event)})
    if kind == "output":
        artifact = a2a.Artifact(artifact_id=OUTPUT_ARTIFACT, name=OUTPUT_ARTIFACT)
        artifact.parts.append(json_part(event.output.output_json))
        return a2a.TaskArtifactUpdateEvent(
            task_id=task_id,
            context_id=context_id,
            artifact=artifact,
            last_chunk=True,
            metadata=metadata,
        )
    status = status_of_event(event, pending=pending)
    status.message.message_id = message_id(task_id, event.sequence)
    status.message.task_id = task_id
    status.message.context_id = context_id
    return a2a.TaskStatusUpdateEvent(
        task_id=task_id, context_id=context_id, status=status, metadata=metadata
    )


def status_of_event(
    event: pb.StreamEvent, *, pending: Sequence[PendingRequest] = ()
) -> a2a.TaskStatus:
    """The task status after ``event`` (see ``stream_event``), with its message."""
    kind = event.WhichOneof("payload") or ""
    message = a2a.Message(role=a2a.ROLE_AGENT)
    state: a2a.TaskState = a2a.TASK_STATE_WORKING
    if kind in _TERMINAL_STATUS:
        state = task_state(_TERMINAL_STATUS[kind])
        text = terminal_text(event)
        if text:
            message.parts.append(a2a.Part(text=text))
    elif kind == "suspended":
        state = a2a.TASK_STATE_INPUT_REQUIRED
        message.parts.append(a2a.Part(data=_value(pending_data(pending))))
    message.parts.append(a2a.Part(data=_value(event_data(event))))
    status = a2a.TaskStatus(state=state, message=message)
    if event.HasField("time"):
        status.timestamp.CopyFrom(event.time)
    return status


def terminal_text(event: pb.StreamEvent) -> str:
    """What a terminal event says in words: the output, the error or the reason."""
    kind = event.WhichOneof("payload")
    if kind == "completed":
        return event.completed.output_json
    if kind == "failed":
        return event.failed.error
    if kind == "interrupted":
        return event.interrupted.reason
    if kind == "terminated":
        return event.terminated.reason
    return ""


def json_part(text: str) -> a2a.Part:
    """A data part of the JSON ``text`` (a text part when it is not JSON)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return a2a.Part(text=text)
    return a2a.Part(data=_value(value), media_type="application/json")


def _value(value: Any) -> struct_pb2.Value:
    # Struct.update fills an object in C++; ParseDict walks it field by field in Python
    # (per status event, a third of the server's mapping cost).
    result = struct_pb2.Value()
    if isinstance(value, dict):
        result.struct_value.update(value)
    else:
        json_format.ParseDict(value, result)
    return result
