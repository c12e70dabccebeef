"""A companion child's lifecycle: start, continue, follow and record its turns."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from helix_transport._config import RetryConfig
from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError, SessionExists, SessionStateConflict
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import (
    ToolContext,
    ToolError,
    reserve_children,
)
from helix_transport.delegation.child_records import (
    child_metadata,
    save_child_ref,
    subagent_ended,
    subagent_started,
)
from helix_transport.delegation.companions._roster import (
    Child,
    Children,
    PersistentChild,
    child_session_id,
)
from helix_transport.delegation.forwarding import (
    UNFINISHED,
    forward_child,
    forwarded_so_far,
    new_child,
    start_logged,
    status_of,
)
from helix_transport.delegation.spans import end_delegation, open_delegation
from helix_transport.registry import resolve_address
from helix_transport.store import SubSessionRef
from helix_transport.transport import AgentClient


class Lifecycle:
    types: dict[str, PersistentChild]

    # --- the child's lifecycle ---------------------------------------------------------

    async def _start(
        self, ctx: ToolContext, config: PersistentChild, name: str, message: str
    ) -> Child:
        address = self._address(config)
        child = Child(
            name=name,
            agent_type=config.agent_type,
            session_id=child_session_id(ctx.session_id, name, ctx.child_scope),
            address=address,
            tool_call_id=ctx.tool_call_id,
        )
        try:
            await reserve_children(ctx, [child.session_id])
        except ToolError:
            Children(ctx.run.state.companions).discard(name)  # free a reserved name
            raise
        client = await ctx.run.clients.get(address)
        # One delegation span per child, not per turn: the child keeps the trace context
        # of its Start (Continue carries none), so every turn's run nests under it.
        trace_context = open_delegation(
            ctx, child_session_id=child.session_id, agent_type=child.agent_type
        )
        metadata = child_metadata(ctx, trace_context)
        # The ref before the Start, so that an interrupt cascading while the Start is in
        # flight finds the child (see cascade.Cascade).
        previous = await ctx.run.store.get_subsession_ref(ctx.session_id, child.session_id)
        if previous is None:
            new_child(ctx, child.session_id)
        await self._save_ref(ctx, child)
        try:
            await client.start(
                _as_input(config, message),
                session_id=child.session_id,
                parent_session_id=ctx.session_id,
                metadata=metadata,
                retry=_until_answered(client),
                delegation_path=ctx.child_delegation_path,
                limits=ctx.child_limits(),
            )
        except HelixError as exc:
            end_delegation(
                ctx,
                child_session_id=child.session_id,
                status=SessionStatus.FAILED,
                error=f"could not start: {exc.message}",
            )
            if isinstance(exc, SessionExists):
                # Not this call's child. A ref from before (a spawn whose Start landed
                # before the parent crashed, say) still says what that session is; with
                # none, a failed one keeps cascades away from a session not ours.
                if previous is not None:
                    await ctx.run.store.put_subsession_ref(previous)
                else:
                    child.status, child.error = "failed", f"could not start: {exc.message}"
                    await self._save_ref(ctx, child)
                raise ToolError(
                    f"child {name!r}: its session exists with another first message"
                ) from None
            child.status, child.error = "failed", f"could not start: {exc.message}"
            await self._save_ref(ctx, child)  # not running: nothing to cascade to
            Children(ctx.run.state.companions).discard(name)  # free a reserved name
            raise ToolError(f"could not spawn {name!r}: {exc.message}") from exc
        # A spawn re-run by a resumed parent: its subagent_start may be in the log.
        logged = previous is not None and await start_logged(ctx, child.session_id)
        await self._began(ctx, child, ref_saved=True, logged=logged)
        return child

    async def _continue(
        self, ctx: ToolContext, child: Child, message: str, *, fresh_message: str | None = None
    ) -> Child:
        """The child's next turn: remembered when it completed, else fresh (its input
        from ``fresh_message``, default ``message``).

        Only a completed turn is continued with memory: a service would resume an
        interrupted one too, but a companion starts that over. A parent re-running
        this call after a crash names the same turn and rejoins it (a replay).
        """
        config = self.types[child.agent_type]
        client = await ctx.run.clients.get(child.address)
        turn = child.turn + 1
        replaced = await self._running_ref(
            ctx, dataclasses.replace(child, tool_call_id=ctx.tool_call_id)
        )
        reply: pb.ContinueResponse | None = None
        try:
            try:
                if await _remembers(client, child):
                    reply = await client.continue_session(
                        child.session_id, message, turn=turn, retry=_until_answered(client)
                    )
            except (SessionStateConflict, SessionExists) as exc:
                if isinstance(exc, SessionStateConflict) and "fresh" not in exc.problem:
                    raise
            if reply is None:
                # A fresh turn starts like a first one: from an input.
                fresh = _as_input(config, message if fresh_message is None else fresh_message)
                reply = await client.continue_session(
                    child.session_id, fresh, turn=turn, fresh=True, retry=_until_answered(client)
                )
        except SessionStateConflict as exc:
            await self._put_back(ctx, replaced)
            if "still running" in exc.problem:
                raise ToolError(f"child {child.name!r} is already running") from None
            raise ToolError(f"child {child.name!r}: {exc.problem}") from None
        except HelixError as exc:
            if isinstance(exc, SessionExists):  # refused: no turn of ours began
                await self._put_back(ctx, replaced)
            # Otherwise (the service out of reach, say) the turn may have begun: the
            # child stays recorded running, where a cascade finds it.
            raise ToolError(f"could not continue {child.name!r}: {exc.message}") from exc
        child = dataclasses.replace(
            child,
            turn=turn,
            from_sequence=reply.from_sequence,
            tool_call_id=ctx.tool_call_id,
            status="running",
            error="",
            delivered=False,
        )
        await self._began(ctx, child, ref_saved=True)  # as _running_ref saved it
        return child

    async def _running_ref(self, ctx: ToolContext, child: Child) -> SubSessionRef | None:
        """Record ``child`` running before asking it for a turn, as ``_start`` does
        before a Start: an interrupt cascading while the request is in flight finds it
        (the turn starts even if the parent stops waiting). Returns the ref replaced."""
        replaced = await ctx.run.store.get_subsession_ref(ctx.session_id, child.session_id)
        await self._save_ref(ctx, dataclasses.replace(child, status="running", error=""))
        return replaced

    async def _put_back(self, ctx: ToolContext, replaced: SubSessionRef | None) -> None:
        """A turn refused: the child's ref goes back to what it said."""
        if replaced is not None:
            await ctx.run.store.put_subsession_ref(replaced)

    async def _began(
        self, ctx: ToolContext, child: Child, *, ref_saved: bool = False, logged: bool = False
    ) -> None:
        """Record the turn begun; ``logged``: its ``subagent_start`` is in the log already.

        A later turn asks the log: a parent re-running the call (or the step) that began
        it after a crash must not log its start twice.
        """
        Children(ctx.run.state.companions).put(child)
        if not logged and child.turn > 1:
            logged = await start_logged(ctx, child.session_id, turn=child.turn)
        if not logged:
            ctx.emit(
                subagent_started(
                    # The call that started the turn; a queue's turn keeps the spawn's (the
                    # step hook that hands a queue over is no tool call).
                    tool_call_id=child.tool_call_id,
                    child_id=child.session_id,
                    agent_type=child.agent_type,
                    address=child.address,
                )
            )
        if not ref_saved:
            await self._save_ref(ctx, child)

    async def _await_turn(
        self, ctx: ToolContext, child: Child, *, timeout_s: float | None
    ) -> dict[str, Any]:
        """Wait for the child's current turn to end; its outcome is delivered here."""
        if child.status == "running":
            try:
                async with asyncio.timeout(timeout_s):
                    await self._follow(ctx, child)
            except TimeoutError:
                return {"name": child.name, "status": "timeout", "detail": "still running"}
        self._delivered(ctx, child)
        return {"name": child.name, **child.outcome()}

    async def _rejoin(
        self, ctx: ToolContext, child: Child, message: str
    ) -> tuple[Child, dict[str, Any] | None, int]:
        """A spawn of a child seen running: its new turn, the last one's unseen outcome,
        and how many queued messages were dropped.

        A parent re-running this call after a crash may have started the child's next
        turn itself, before a checkpoint could record it: asked for again, that turn is
        answered as a replay and rejoined, as the first try left it (its messages, fresh
        or not). A turn that is not this call's is ``already running``.
        """
        queued = "\n\n".join([*child.inbox, message])  # as a completed turn takes them
        following = await self._continue(
            ctx, dataclasses.replace(child, inbox=[]), queued, fresh_message=message
        )
        ended = dataclasses.replace(child)
        try:
            client = await ctx.run.clients.get(child.address)
            await self._record_end(client, ended, following.from_sequence)
        except HelixError:
            return following, None, 0  # how it ended is out of reach; the turn goes on
        previous = self._unseen_outcome(ctx, ended)
        Children(ctx.run.state.companions).put(following)  # the entry is the new turn's again
        dropped = len(child.inbox) if ended.status != "completed" else 0
        return following, previous, dropped

    async def _continue_showing(
        self, ctx: ToolContext, child: Child, message: str, previous: dict[str, Any] | None
    ) -> Child:
        """``_continue``; when it fails, its error carries ``previous`` (an outcome just
        marked delivered), which would otherwise reach the model through no result."""
        try:
            return await self._continue(ctx, child, message)
        except ToolError as exc:
            if previous is None:
                raise
            raise ToolError(with_previous(exc.message, previous)) from exc

    def _unseen_outcome(self, ctx: ToolContext, child: Child) -> dict[str, Any] | None:
        """A finished turn's outcome the parent's model has not seen: shown now, by the
        calling tool's result (and marked delivered); ``None`` when it was seen."""
        if child.status == "running" or child.delivered:
            return None
        self._delivered(ctx, child)
        return child.outcome()

    async def _follow(self, ctx: ToolContext, child: Child) -> None:
        """Forward the current turn's events into the parent's log to its end, and record
        how it ended."""
        client = await ctx.run.clients.get(child.address)
        retry = _until_answered(client)
        final = await forward_child(
            ctx,
            child_id=child.session_id,
            tool_call_id=child.tool_call_id,
            client=client,
            retry=retry,
            past=child.from_sequence,
            rejoining=True,  # a turn followed before a suspension may still wait for input
        )
        if final is not None and final.sequence > child.from_sequence:
            status = status_of(final)
        else:  # the log held the whole turn already (a resumed parent): ask how it ended
            status = await client.wait(
                child.session_id, from_sequence=child.from_sequence, retry=retry
            )
        await self._record(ctx, child, status)

    async def _refresh(self, ctx: ToolContext, child: Child) -> None:
        """Bring a running child up to date: one ``GetStatus``, and its events up to there
        forwarded into the parent's log."""
        if child.status != "running":
            return
        client = await ctx.run.clients.get(child.address)
        try:
            status = await client.get_status(child.session_id)
            await forward_child(
                ctx,
                child_id=child.session_id,
                tool_call_id=child.tool_call_id,
                client=client,
                until=status.last_sequence,
            )
        except HelixError:
            return  # unreachable for now: still "running" as far as we know
        # Terminal, past the start of our turn: the turn we started has ended.
        if status.status not in UNFINISHED and status.last_sequence > child.from_sequence:
            await self._record(ctx, child, status)

    async def _record(self, ctx: ToolContext, child: Child, status: pb.GetStatusResponse) -> None:
        child.status = SessionStatus.from_proto(status.status).value
        child.output_json = status.output_json if child.status == "completed" else ""
        child.error = status.error
        Children(ctx.run.state.companions).put(child)
        await self._save_ref(ctx, child)
        self._end_span(ctx, child)

    def _end_span(self, ctx: ToolContext, child: Child) -> None:
        """End the child's delegation span (open until its first turn ends) when the
        parent learns how the turn ended: recorded (after the ref's write, see
        helix_transport.delegation.spans), or seen otherwise and delivered."""
        if child.status == "running":  # delivered unended (a terminate not seen through)
            return
        end_delegation(
            ctx,
            child_session_id=child.session_id,
            status=SessionStatus(child.status),
            error=child.error,
        )

    async def _save_ref(self, ctx: ToolContext, child: Child) -> None:
        await save_child_ref(
            ctx,
            child_id=child.session_id,
            agent_type=child.agent_type,
            tool_call_id=child.tool_call_id,
            status=SessionStatus(child.status),
            address=child.address,
            output_json=child.output_json,
            error=child.error,
        )

    # --- helpers ----------------------------------------------------------------------

    def _known(self, ctx: ToolContext, name: str) -> Child:
        child = Children(ctx.run.state.companions).get(name)
        if child is None:
            known = ", ".join(c.name for c in Children(ctx.run.state.companions).all()) or "none"
            raise ToolError(f"no child agent named {name!r} (children: {known})")
        return child

    def _address(self, config: PersistentChild) -> str:
        try:
            return config.address or resolve_address(config.agent_type)
        except HelixError as exc:
            raise ToolError(f"{config.agent_type}: {exc.message}") from exc

    async def _record_end(self, client: AgentClient, child: Child, sequence: int) -> None:
        """Record the turn that ended at ``sequence`` (its terminal event, just before
        the next turn's ``turn_started``) as the child's current turn."""
        async for event in client.stream(child.session_id, from_sequence=sequence - 1):
            kind = event.WhichOneof("payload") if event.sequence == sequence else None
            if kind == "completed":
                child.status, child.error = "completed", ""
                child.output_json = event.completed.output_json
                return
            if kind in ("failed", "interrupted"):
                child.status, child.output_json = kind, ""
                child.error = event.failed.error if kind == "failed" else event.interrupted.reason
                return
            break
        raise HelixError(f"child {child.name!r}: no turn's end at sequence {sequence}")

    def _delivered(self, ctx: ToolContext, child: Child) -> None:
        """Mark the turn's outcome delivered (durable with the next checkpoint)."""
        if child.delivered:
            return
        child.delivered = True
        Children(ctx.run.state.companions).put(child)
        status = SessionStatus(child.status)
        self._end_span(ctx, child)
        # A delivery re-run by a resumed parent (its end flushed, its checkpoint not):
        # the log, as last read (a rejoin reads it), already holds this turn's end.
        if forwarded_so_far(ctx).child_so_far(child.session_id).ends >= child.turn:
            return
        ctx.emit(
            subagent_ended(
                tool_call_id=child.tool_call_id,
                child_id=child.session_id,
                agent_type=child.agent_type,
                status=status,
                output_json=child.output_json if status is SessionStatus.COMPLETED else "",
                error=child.error,
            )
        )


def _until_answered(client: AgentClient) -> RetryConfig:
    """Waiting on a child has no deadline of its own: an unreachable child is not a
    failed one (the tool's timeout or the parent's interrupt ends the wait)."""
    return client.config.reconnect.until_cancelled()


def with_previous(problem: str, previous: dict[str, Any] | None) -> str:
    """An error that also shows the previous turn's outcome, when this call marked it
    delivered: no other result would bring it to the model."""
    if previous is None:
        return problem
    return f"{problem} (its previous turn, not shown before: {json.dumps(previous)})"


def _as_input(config: PersistentChild, message: str) -> str:
    return message if config.input_field is None else json.dumps({config.input_field: message})


async def _remembers(client: AgentClient, child: Child) -> bool:
    """Whether ``child``'s next turn keeps its memory: its last turn completed. One seen
    running has ended since (or its next turn began, before a crash of ours: then
    asking keeps the replay's own rule, as a refusal falls back to fresh)."""
    if child.status != "running":
        return child.status == "completed"
    status = (await client.get_status(child.session_id)).status
    return status == pb.SESSION_STATUS_COMPLETED or status in UNFINISHED  # then it refuses
