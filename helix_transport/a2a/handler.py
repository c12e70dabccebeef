"""A2A's request handler over a service's sessions (``SessionsEdge``): no second run
path, and no task store or event queue of the SDK's.

The source of truth is the session's durable log: a stream, a resubscription and
``GetTask`` all read it (replayed from the store, then live), so they survive a
restart and answer the same from any replica.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as a2a
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from google.protobuf import json_format

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    HelixError,
    InvalidArgument,
    SessionNotFound,
    SessionStateConflict,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a import mapping, tasks, tenancy
from helix_transport.server.edge import ANONYMOUS, Principal, SessionsEdge
from helix_transport.tree import PendingRequest

PRINCIPAL = "helix_principal"
"""``ServerCallContext.state`` key of the caller, set by the authentication middleware."""
BEARER = "helix_bearer"
"""``ServerCallContext.state`` key of the caller's bearer token (forwarded to children)."""
FROM_SEQUENCE_HEADER = "helix-from-sequence"
"""Optional header of ``SubscribeToTask``: replay only what follows this sequence."""

CANCEL_REASON = "canceled through A2A"
CANCEL_WAIT_S = 5.0
"""How long ``CancelTask`` waits for the tree to stop before it answers."""

Event = a2a.Task | a2a.Message | a2a.TaskStatusUpdateEvent | a2a.TaskArtifactUpdateEvent


@contextlib.contextmanager
def a2a_errors() -> Iterator[None]:
    """helix's errors as A2A's: an unknown and a foreign task alike are not found."""
    try:
        yield
    except SessionNotFound:
        raise TaskNotFoundError() from None
    except InvalidArgument as exc:
        violations = [{"field": f, "problem": p} for f, p in exc.violations]
        data = {"field": exc.field, "problem": exc.problem, "violations": violations}
        raise InvalidParamsError(exc.message, data=data) from None
    except SessionStateConflict as exc:
        raise InvalidRequestError(exc.message) from None
    except HelixError as exc:
        raise InternalError(f"{type(exc).__name__}: {exc.message}") from None


class HelixRequestHandler(RequestHandler):
    """Serves A2A's methods from one agent service's sessions."""

    def __init__(self, edge: SessionsEdge) -> None:
        self.edge = edge

    def _as_caller(
        self, context: ServerCallContext, params: object = None
    ) -> contextlib.AbstractContextManager[None]:
        principal: Principal = context.state.get(PRINCIPAL, ANONYMOUS)
        if self.edge.authenticates and principal == ANONYMOUS:
            # The middleware refuses first; a handler reached without it is refused too.
            raise InvalidRequestError("unauthenticated")
        if params is not None:  # A2A's tenant: the caller's, or refused (tenancy.py)
            tenancy.check(params, context, principal)
        return self.edge.acting_as(principal, context.state.get(BEARER))

    # -- reading ----------------------------------------------------------------

    async def on_get_task(self, params: a2a.GetTaskRequest, context: ServerCallContext) -> a2a.Task:
        with self._as_caller(context, params), a2a_errors():
            return await self._task(params.id)

    async def _task(self, task: str) -> a2a.Task:
        session_id, turn = tasks.split_task_id(task)
        status = await self.edge.status(session_id)
        events = await self.edge.read(session_id)
        state = SessionStatus.from_proto(status.status)
        latest = tasks.turn_count(events)
        if turn > latest:
            raise TaskNotFoundError()
        pending = tasks.pending_requests(events) if state is SessionStatus.SUSPENDED else []
        return tasks.build_task(
            task=task,
            context_id=session_id,
            events=tasks.turn_events(events, turn),
            status=state if turn == latest else SessionStatus.COMPLETED,
            pending=pending,
        )

    async def on_list_tasks(
        self, params: a2a.ListTasksRequest, context: ServerCallContext
    ) -> a2a.ListTasksResponse:
        with self._as_caller(context), a2a_errors():
            if tenancy.foreign(params, context, context.state.get(PRINCIPAL, ANONYMOUS)):
                return a2a.ListTasksResponse()  # the caller has no task in another tenant
            if params.context_id:  # one conversation: its session's latest task
                try:
                    found = [await self._latest_task(params.context_id)]
                except TaskNotFoundError:
                    found = []
                return a2a.ListTasksResponse(tasks=found, page_size=len(found))
            request = pb.ListSessionsRequest(
                page_size=params.page_size or 50, page_token=params.page_token
            )
            wanted = mapping.session_status(params.status) if params.status else None
            if wanted is not None:
                request.statuses.extend(
                    s.to_proto() for s, t in mapping.TASK_STATES.items() if t == params.status
                )
            listed = await self.edge.list_sessions(request)
            response = a2a.ListTasksResponse(next_page_token=listed.next_page_token)
            for summary in listed.sessions:
                item = response.tasks.add(id=summary.session_id, context_id=summary.session_id)
                item.status.state = mapping.task_state(SessionStatus.from_proto(summary.status))
                item.status.timestamp.CopyFrom(summary.updated_at)
                item.metadata.update(
                    {
                        mapping.METADATA_KEY: {
                            "agent_type": summary.agent_type,
                            "last_sequence": summary.last_sequence,
                        }
                    }
                )
            response.page_size = len(response.tasks)
            return response

    async def _latest_task(self, session_id: str) -> a2a.Task:
        events = await self.edge.read(session_id)
        return await self._task(tasks.task_id(session_id, tasks.turn_count(events)))

    # -- cancelling -------------------------------------------------------------

    async def on_cancel_task(
        self, params: a2a.CancelTaskRequest, context: ServerCallContext
    ) -> a2a.Task:
        with self._as_caller(context, params), a2a_errors():
            session_id, _ = tasks.split_task_id(params.id)
            before = await self._task(params.id)
            if before.status.state in mapping.TERMINAL_TASK_STATES:
                raise TaskNotCancelableError()
            answer = await self.edge.interrupt(
                pb.InterruptRequest(session_id=session_id, reason=CANCEL_REASON)
            )
            if not answer.accepted:
                raise TaskNotCancelableError()
            await self.edge.status(session_id, wait_s=CANCEL_WAIT_S)
            return await self._task(params.id)

    # -- sending ----------------------------------------------------------------

    async def on_message_send(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> a2a.Task:
        last: a2a.Task | None = None
        async for event in self.on_message_send_stream(params, context):
            if isinstance(event, a2a.Task):
                last = event
                if params.configuration.return_immediately:
                    return event
        assert last is not None  # the stream begins with the task
        with self._as_caller(context), a2a_errors():
            return await self._task(last.id)

    async def on_message_send_stream(
        self, params: a2a.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        with self._as_caller(context, params):
            with a2a_errors():
                task, from_sequence, text_open = await self._send(params.message)
                session_id, _ = tasks.split_task_id(task)
                snapshot = await self._task(task)
            yield snapshot
            async for event in self._events(task, session_id, from_sequence, text_open):
                yield event

    async def _send(self, message: a2a.Message) -> tuple[str, int, bool]:
        """Start (or continue, or answer) what ``message`` asks; the task, the sequence
        its stream follows from and whether its ``text`` artifact was begun by then."""
        if not message.message_id:
            raise InvalidParamsError("message.message_id: required", data={"field": "messageId"})
        if message.task_id:
            return await self._answer(message)
        session_id = message.context_id or tasks.session_id_for(message.message_id)
        try:
            events = await self.edge.read(session_id) if message.context_id else []
        except SessionNotFound:
            events = []
        if events:
            return await self._continue(session_id, message, events)
        input_json, _ = tasks.message_input(message, self.edge.agent)
        request = pb.StartRequest(session_id=session_id, input_json=input_json)
        request.metadata["a2a.message_id"] = message.message_id
        await self.edge.start(request)
        return tasks.task_id(session_id), 0, False

    async def _continue(
        self, session_id: str, message: a2a.Message, events: list[pb.StreamEvent]
    ) -> tuple[str, int, bool]:
        """A message in an existing conversation: its session's next turn."""
        text = "".join(p.text for p in message.parts if p.HasField("text"))
        fresh = any(p.HasField("data") for p in message.parts)
        if fresh:
            text, _ = tasks.message_input(message, self.edge.agent)
        turn = tasks.turn_count(events) + 1
        continued = await self.edge.continue_turn(
            pb.ContinueRequest(session_id=session_id, turn=turn, message=text, fresh=fresh)
        )
        return tasks.task_id(session_id, continued.turn), continued.from_sequence, False

    async def _answer(self, message: a2a.Message) -> tuple[str, int, bool]:
        """A message on a task waiting for input answers one of its requests."""
        session_id, turn = tasks.split_task_id(message.task_id)
        status = await self.edge.status(session_id)
        if status.status != pb.SESSION_STATUS_SUSPENDED:
            raise InvalidRequestError(
                f"task {message.task_id!r} is not waiting for input; "
                "send a new message (in its context to continue the conversation)"
            )
        events = await self.edge.read(session_id)
        if turn != tasks.turn_count(events):
            raise InvalidRequestError(f"task {message.task_id!r} has ended")
        data = _answer_data(message)
        try:
            _, request = mapping.answer_request(data, tasks.pending_requests(events))
        except ValueError as exc:
            field, problem = exc.args
            raise InvalidParamsError(f"{field}: {problem}", data={"field": field}) from None
        await self.edge.submit_input(request)
        text_open = tasks.text_started(tasks.turn_events(events, turn), status.last_sequence)
        return message.task_id, status.last_sequence, text_open

    # -- following --------------------------------------------------------------

    async def on_subscribe_to_task(
        self, params: a2a.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        with self._as_caller(context, params):
            with a2a_errors():
                session_id, turn = tasks.split_task_id(params.id)
                snapshot = await self._task(params.id)
                events = tasks.turn_events(await self.edge.read(session_id), turn)
                first = events[0].sequence - 1 if events else 0
                from_sequence = max(first, _from_sequence_header(context))
                text_open = tasks.text_started(events, from_sequence)
            yield snapshot
            if snapshot.status.state in mapping.TERMINAL_TASK_STATES:
                # Ended: its events are replayed from the log, then the stream ends.
                rest = [logged for logged in events if logged.sequence > from_sequence]
                for run in mapping.runs(rest):
                    yield self._update(run, params.id, session_id, text_open)
                    text_open = text_open or mapping.is_text(run[0])
                return
            async for event in self._events(params.id, session_id, from_sequence, text_open):
                yield event

    async def _events(
        self, task: str, session_id: str, from_sequence: int, text_open: bool
    ) -> AsyncIterator[Event]:
        """The task's events after ``from_sequence`` until its turn ends or it waits for
        input (A2A ends a stream at input-required; the answer opens the next).

        What one batch of the log holds (a reader behind the writer gets many events
        at once) is sent as fewer updates: its consecutive text deltas as one
        (``mapping.runs``); nothing waits for more. ``text_open``: the ``text``
        artifact was begun before ``from_sequence`` (its next chunk appends)."""
        with a2a_errors():
            async for batch in self.edge.follow(session_id, from_sequence=from_sequence):
                for run in mapping.runs(batch):
                    event = run[0]
                    pending: tuple[PendingRequest, ...] = ()
                    suspended = event.WhichOneof("payload") == "suspended"
                    if suspended:
                        pending = tuple(tasks.pending_requests(await self.edge.read(session_id)))
                    yield self._update(run, task, session_id, text_open, pending)
                    if suspended:
                        return
                    text_open = text_open or mapping.is_text(event)

    @staticmethod
    def _update(
        run: Sequence[pb.StreamEvent],
        task: str,
        session_id: str,
        text_open: bool,
        pending: Sequence[PendingRequest] = (),
    ) -> Event:
        """The one update of ``run`` (``mapping.runs``)."""
        if mapping.is_text(run[0]):
            return mapping.text_update(run, task_id=task, context_id=session_id, append=text_open)
        return mapping.stream_event(run[0], task_id=task, context_id=session_id, pending=pending)

    # -- not offered ------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: a2a.TaskPushNotificationConfig, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(
        self, params: a2a.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> a2a.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(
        self, params: a2a.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> a2a.ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(
        self, params: a2a.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(
        self, params: a2a.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> a2a.AgentCard:
        raise ExtendedAgentCardNotConfiguredError()


def _answer_data(message: a2a.Message) -> dict[str, Any]:
    """The answer a message carries: its data part, or its text as JSON (a bare
    ``yes``/``no`` approves or denies)."""
    for part in message.parts:
        if part.HasField("data"):
            value = json_format.MessageToDict(part.data)
            if isinstance(value, dict):
                return value
    text = "".join(p.text for p in message.parts if p.HasField("text")).strip()
    if text.lower() in ("yes", "approve", "approved"):
        return {"approved": True}
    if text.lower() in ("no", "deny", "denied"):
        return {"approved": False}
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidParamsError(
            "message.parts: an answer is a data part ({'request_id', 'approved'|'result'})",
            data={"field": "message.parts"},
        )
    return parsed


def _from_sequence_header(context: ServerCallContext) -> int:
    headers: dict[str, str] = context.state.get("headers", {})
    value = headers.get(FROM_SEQUENCE_HEADER, "0")
    if not value.isdigit():
        raise InvalidParamsError(f"{FROM_SEQUENCE_HEADER}: must be a sequence (0 or more)")
    return int(value)
