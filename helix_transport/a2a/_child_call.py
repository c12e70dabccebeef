"""One call of an A2A agent as a child: send the message once, record its task, follow
the task into the parent's log, end the call with the task's outcome."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from a2a.types import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value

from helix_transport._events import SessionStatus
from helix_transport._exceptions import (
    HelixError,
    LeaseLost,
    SequenceConflict,
    SessionNotFound,
    StoreUnavailable,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.a2a._child_client import A2AChildClient, a2a_address, call_context
from helix_transport.a2a._child_projection import (
    ASKING_STATES,
    PEER_SEQUENCE_KEY,
    ChildIdentity,
    Cursor,
    message_text,
    project,
    state_name,
    task_output_json,
)
from helix_transport.a2a.mapping import METADATA_KEY, TERMINAL_TASK_STATES, session_status
from helix_transport.agent.blockage import BlockedChild
from helix_transport.agent.tools import ToolContext, ToolError, derived_session_id, reserve_children
from helix_transport.delegation.cascade import Cascade
from helix_transport.delegation.child_records import (
    record_child_end,
    subagent_started,
)
from helix_transport.delegation.forwarding import forwarded_so_far
from helix_transport.store import SubSessionRef, pages

_TRACE_KEYS = ("traceparent", "tracestate")
FROM_SEQUENCE_HEADER = "helix-from-sequence"
"""A helix peer's ``SubscribeToTask`` replays only what follows this sequence (its
A2A endpoint's own header, ``helix_transport.a2a.handler``)."""


def child_session_id(parent_session_id: str, tool_call_id: str, scope: str) -> str:
    """The child id of the A2A task a tool call starts: also the task's ``contextId``
    and the stem of its message's id, so a restarted parent finds the task again."""
    return derived_session_id(parent_session_id, "peer", tool_call_id, scope)


def message_id_of(child_id: str) -> str:
    """The id of the one message a tool call sends its A2A agent."""
    return f"{child_id}-message"


class A2AChildCall:
    """One delegation to an A2A agent: start or rejoin its task, forward, end."""

    def __init__(self, ctx: ToolContext, client: A2AChildClient, *, agent_type: str) -> None:
        self.ctx = ctx
        self.client = client
        self.agent_type = agent_type
        self.child_id = child_session_id(ctx.session_id, ctx.tool_call_id, ctx.child_scope)
        self.task_id = ""
        self.cursor = Cursor()
        self.headers: dict[str, str] = {}
        self.sent = False
        """The message may have reached the agent (sent in this run, or a ref from before)."""
        self.identity = ChildIdentity(
            session_id=self.child_id,
            agent_type=agent_type,
            parent_session_id=ctx.session_id,
            path=(*ctx.run.session_path, self.child_id),
        )
        self.ref = SubSessionRef(
            parent_session_id=ctx.session_id,
            child_session_id=self.child_id,
            agent_type=agent_type,
            tool_call_id=ctx.tool_call_id,
            address=client.address,
        )

    async def run(self, message: Message, *, timeout_s: float | None = None) -> Any:
        ctx = self.ctx
        self.identity = dataclasses.replace(self.identity, message=message)
        await reserve_children(ctx, [self.child_id])
        existing = await ctx.run.store.get_subsession_ref(ctx.session_id, self.child_id)
        started: set[str] = set()
        if existing is not None:  # a resumed parent rejoining its child
            self.ref, self.sent = existing, True
            self.task_id = self.client.task_of(existing.address)
            logged = await forwarded_so_far(ctx).logged(ctx.tool_call_id)
            if logged.end is not None:
                return await self._ended_before(logged.end)
            started = logged.started
            await self._read_cursor()
        else:
            # Durable before the message goes: a parent that dies after sending it finds
            # the ref, and through it the task (by its contextId, the child id).
            await self._save()
        if self.child_id not in started:
            ctx.emit(
                subagent_started(
                    tool_call_id=ctx.tool_call_id,
                    child_id=self.child_id,
                    agent_type=self.agent_type,
                    address=self.ref.address,
                )
            )
        trace = ctx.run.hooks.on_delegation_start(
            tool_call_id=ctx.tool_call_id,
            child_session_id=self.child_id,
            agent_type=self.agent_type,
        )
        self.headers = {k: v for k, v in trace.items() if k in _TRACE_KEYS}
        try:
            async with asyncio.timeout(timeout_s):
                task = await self._follow(message)
        except TimeoutError:
            await self.give_up(f"timed out after {timeout_s:g}s")
            raise ToolError(f"{self.agent_type} timed out after {timeout_s:g}s") from None
        except (StoreUnavailable, SequenceConflict, LeaseLost):
            raise  # the parent's own store: a resumed parent rejoins the task
        except HelixError as exc:  # a definitive answer from the agent
            if self.task_id:
                await self._stop(f"parent {ctx.session_id} lost its task: {exc.message}")
            return await self._end(SessionStatus.FAILED, error=f"{self.agent_type}: {exc.message}")
        return await self._outcome(task)

    async def _follow(self, message: Message) -> Task:
        """Follow the task to an end state, resuming after any break; the task then."""
        retry = self.client.config.reconnect.until_cancelled()
        attempt = 0
        while True:
            try:
                async for task in self._updates(message):
                    if self._forward(task):
                        attempt = 0  # only progress resets the pause: no polling a quiet agent
                    if task.status.state in TERMINAL_TASK_STATES:
                        return task
            except HelixError as exc:
                if not exc.retryable:
                    raise
            # A break, or a stream the agent closed with the task waiting (for input):
            # resume from a fresh snapshot, after a pause.
            await asyncio.sleep(retry.backoff_s(attempt))
            attempt += 1

    async def _updates(self, message: Message) -> AsyncIterator[Task]:
        """One stream of the task, each update applied to the task as last seen."""
        a2a = await self.client.a2a_client()
        context = call_context(self.headers)
        if not self.task_id and self.sent:
            self.task_id = await self.client.find_task(self.child_id, self.headers)
            if self.task_id:
                await self._save(address=a2a_address(self.client.url, self.task_id))
        if self.task_id:
            task = await self.client.get_task(self.child_id, self.headers, task_id=self.task_id)
            yield task
            if task.status.state in TERMINAL_TASK_STATES:
                return
            # A helix peer replays its turn on a subscribe; from here, only what is new.
            after = {FROM_SEQUENCE_HEADER: str(self.cursor.peer_sequence)}
            resume = (
                call_context({**self.headers, **after}) if self.cursor.peer_sequence else context
            )
            stream = a2a.subscribe(SubscribeToTaskRequest(id=self.task_id), context=resume)
        elif self.cursor.messages:  # its message reached it once: never send it again
            raise SessionNotFound(self.child_id)
        else:
            self.sent = True
            stream = a2a.send_message(SendMessageRequest(message=message), context=context)
        current: Task | None = None
        with self.client.mapped(self.child_id):
            async for response in stream:
                current = await self._apply(response, current, message)
                yield current

    async def _apply(self, response: StreamResponse, task: Task | None, message: Message) -> Task:
        """``task`` moved on by ``response``, as the agent's own task store does it."""
        which = response.WhichOneof("payload")
        sequence = peer_sequence(response)
        if task is not None and sequence and sequence <= self.cursor.peer_sequence:
            return task  # a helix peer replaying what this call has applied already
        self.cursor.peer_sequence = max(self.cursor.peer_sequence, sequence)
        named = {
            "task": response.task.id,
            "status_update": response.status_update.task_id,
            "artifact_update": response.artifact_update.task_id,
        }.get(which or "", "")
        if named and not self.task_id:  # recorded before anything of the task is forwarded
            self.task_id = named
            await self._save(address=a2a_address(self.client.url, self.task_id))
        if which == "task":
            return response.task
        if which == "message":  # the agent answered without a task
            done = TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=response.message)
            return Task(id=self.task_id, context_id=self.child_id, history=[message], status=done)
        if task is None:
            return await self.client.get_task(self.child_id, self.headers, task_id=self.task_id)
        if which == "status_update":
            update = response.status_update
            if update.status.message.message_id and (
                update.status.message.message_id == task.status.message.message_id
            ):
                return task  # a snapshot taken after it already holds it
            if task.status.state in ASKING_STATES and update.status.state not in ASKING_STATES:
                # Answered: the answer is in the agent's history, never on this stream.
                return await self.client.get_task(self.child_id, self.headers, task_id=self.task_id)
            if task.status.HasField("message"):
                task.history.append(task.status.message)
            if update.HasField("metadata"):
                task.metadata.MergeFrom(update.metadata)
            task.status.CopyFrom(update.status)
        elif which == "artifact_update":
            apply_artifact(task, response.artifact_update)
            if sequence:
                for artifact in task.artifacts:
                    if artifact.artifact_id == response.artifact_update.artifact.artifact_id:
                        artifact.metadata[PEER_SEQUENCE_KEY] = sequence
        return task

    def _forward(self, task: Task) -> bool:
        """Emit what ``task`` adds to the parent's log (no await: a cancellation cannot
        split the events from the cursor that counts them); whether it added any."""
        ctx = self.ctx
        events = project(task, self.cursor, self.identity)
        for event in events:
            ctx.emit(
                pb.StreamEvent(
                    child_event=pb.ChildEvent(tool_call_id=ctx.tool_call_id, event=event)
                )
            )
            if event.WhichOneof("payload") in ("completed", "failed", "interrupted"):
                ctx.run.cache.child_totals.note(event)
        blockage, call_id = ctx.run.blockage, ctx.tool_call_id
        if task.status.state in ASKING_STATES and self.cursor.request_id:
            child = BlockedChild(
                child_session_id=self.child_id,
                address=self.ref.address,
                last_sequence=self.cursor.last_sequence,
            )
            blockage.block(call_id, child)
        else:
            blockage.unblock(call_id)
        return bool(events)

    async def _read_cursor(self) -> None:
        """What the parent's log holds of this call's child (the truth after a crash)."""
        ctx = self.ctx
        async for events in pages(ctx.run.store, ctx.session_id):
            for event in events:
                if event.WhichOneof("payload") != "child_event":
                    continue
                child = event.child_event
                if (
                    child.tool_call_id == ctx.tool_call_id
                    and child.event.session_id == self.child_id
                ):
                    self.cursor.note(child.event)

    async def _outcome(self, task: Task) -> Any:
        status = session_status(task.status.state) or SessionStatus.FAILED
        if status is SessionStatus.COMPLETED:
            return await self._end(status, output_json=task_output_json(task))
        said = message_text(task.status.message) if task.status.HasField("message") else ""
        error = f"{self.agent_type}: its A2A task is {state_name(task.status.state)}"
        return await self._end(status, error=error + (f": {said}" if said else ""))

    async def _ended_before(self, end: pb.SubagentEnd) -> Any:
        """The call's result as the ``subagent_end`` already in the log has it."""
        status = SessionStatus.from_proto(end.status)
        if self.ref.status is SessionStatus.RUNNING:
            await self._save(
                status=status,
                output_json=end.output_json,
                error=end.error,
                completed_at=time.time(),
            )
        if status is not SessionStatus.COMPLETED:
            raise ToolError(end.error)
        return json.loads(end.output_json)

    async def _end(self, status: SessionStatus, *, output_json: str = "", error: str = "") -> Any:
        self.ctx.run.blockage.unblock(self.ctx.tool_call_id)
        self.ref = await record_child_end(
            self.ctx, self.ref, status=status, output_json=output_json, error=error
        )
        if status is not SessionStatus.COMPLETED:
            raise ToolError(error)
        return json.loads(output_json)

    async def _save(self, **changes: Any) -> None:
        self.ref = dataclasses.replace(self.ref, **changes)
        await self.ctx.run.store.put_subsession_ref(self.ref)

    async def _stop(self, reason: str) -> None:
        """Cancel the task through the outbox (asked again until the agent answers)."""
        await Cascade(self.ctx.run.store, self.ctx.run.clients).interrupt_refs(
            [self.ref], reason=reason
        )

    async def give_up(self, reason: str) -> None:
        """Cancel the task and record the call as failed."""
        await self._stop(reason)
        with contextlib.suppress(ToolError):
            await self._end(SessionStatus.FAILED, error=f"{self.agent_type} {reason}")


def peer_sequence(response: StreamResponse) -> int:
    """The sequence a helix peer's stream event carries (``metadata.helix.sequence``,
    ``mapping``); 0 for any other agent's."""
    which = response.WhichOneof("payload")
    if which not in ("status_update", "artifact_update"):
        return 0
    update = response.status_update if which == "status_update" else response.artifact_update
    helix = MessageToDict(update.metadata).get(METADATA_KEY) if update.metadata else None
    sequence = helix.get("sequence") if isinstance(helix, dict) else None
    if isinstance(sequence, int | float) and sequence >= 0:  # a Struct's numbers are floats
        return int(sequence)
    return int(sequence) if isinstance(sequence, str) and sequence.isdigit() else 0


def apply_artifact(task: Task, update: TaskArtifactUpdateEvent) -> None:
    """``update`` applied to ``task`` as ``a2a-sdk``'s task manager applies it (append
    the parts, or replace the artifact), except that an append to an artifact not seen
    yet creates it: a follower tolerates what a strict store would refuse."""
    artifact = update.artifact
    existing = next((a for a in task.artifacts if a.artifact_id == artifact.artifact_id), None)
    if existing is None:
        task.artifacts.append(artifact)
    elif update.append:
        existing.parts.extend(artifact.parts)
        existing.metadata.update(dict(artifact.metadata.items()))
    else:
        existing.CopyFrom(artifact)


def first_message(child_id: str, args: Any, *, text_only: bool) -> Message:
    """The message a call sends: the arguments as a data part, or, for an agent that
    takes text (``text_only``: the tool's schema is ``{"message": string}``), as text."""
    if text_only and isinstance(args, Mapping) and isinstance(args.get("message"), str):
        parts = [Part(text=args["message"])]
    else:
        value = Value()
        value.struct_value.update(dict(args) if isinstance(args, Mapping) else {"input": args})
        parts = [Part(data=value)]
    return Message(
        message_id=message_id_of(child_id), context_id=child_id, role=Role.ROLE_USER, parts=parts
    )
