"""Forwarding a child's events into its parent's log: one way, for every kind of child.

A remote tool's child, a companion and a ``run_subagent`` task all reach their parent's
log the same way: each child event, wrapped as a ``child_event`` (the bytes it arrived
as, never parsed and serialized again), exactly once and in the child's order. The
parent's log is the truth of what was forwarded: a run forwards a child from the last
child sequence its log holds (``ForwardedSoFar``), or, once it has forwarded some
itself, from the last one it emitted (which may not be flushed yet). One forwarder per
child at a time (a lock), so a step hook and a tool following the same companion never
forward an event twice.

A remote tool follows its child to the end; a companion's blocking turn and a parked
``run_subagent`` batch likewise. A child the parent does not wait for (a non-blocking
companion, a task while the parent goes on) is forwarded at each of the parent's steps,
up to the sequence its service reports, so the tree grows step by step. A child still
running when its parent's turn ends is forwarded up to there: the parent's log takes
nothing after its terminal event, and its next turn forwards the rest when it touches
that child again.

Every child's terminal event carries its subtree's usage; the forwarder notes it for the
parent's own terminal event (``helix_transport.tree``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from helix_transport._config import RetryConfig
from helix_transport._events import is_terminal
from helix_transport._exceptions import HelixError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._wire import child_event_payloads, child_event_prefix
from helix_transport.agent.blockage import BlockedChild
from helix_transport.agent.run_cache import ForwardedByRun
from helix_transport.agent.tools import ToolContext
from helix_transport.log.children import ForwardedSoFar
from helix_transport.transport import AgentClient

UNFINISHED = frozenset(
    {pb.SESSION_STATUS_RUNNING, pb.SESSION_STATUS_SUSPENDED, pb.SESSION_STATUS_UNSPECIFIED}
)
"""Statuses of a child that has not ended its turn (a suspended child goes on later)."""

Blocked = Callable[[BlockedChild | None], None]
"""Told whether a followed child waits for input (``forward_child(blocked=...)``)."""


def _forwarded(ctx: ToolContext) -> ForwardedByRun:
    return ctx.run.cache.forwarded


def new_child(ctx: ToolContext, child_id: str) -> None:
    """``child_id`` had no ref before this call: the parent's log holds none of its
    events (a ref is saved before anything of the child is logged), so forwarding it
    starts at 0 without reading the log."""
    _forwarded(ctx).last.setdefault(child_id, 0)


async def forward_child(
    ctx: ToolContext,
    *,
    child_id: str,
    tool_call_id: str,
    client: AgentClient,
    retry: RetryConfig | None = None,
    until: int | None = None,
    past: int = 0,
    rejoining: bool = False,
    blocked: Blocked | None = None,
) -> pb.StreamEvent | None:
    """Forward ``child_id``'s events after the last one the parent's log holds.

    Args:
        ctx: the parent's tool context (its log, its run's cache).
        child_id: the child session.
        tool_call_id: the parent's call the child runs for (``ChildEvent.tool_call_id``).
        client: the child service's client.
        retry: the stream's reconnection (``None``: the client's own, with its deadline).
        until: stop once the log holds this child sequence (a child the parent does not
            wait for: what its service reported last); ``None``: follow to a terminal event.
        past: with ``until=None``, the terminal event to reach is the first one after this
            child sequence (the start of the turn waited for: a companion's earlier turn
            may not be forwarded in full yet).
        rejoining: the call follows a child it followed before (a resumed parent): ask
            its status first, so a child still suspended where the log left it counts as
            blocked at once (its stream has nothing new to say so).
        blocked: told the child it waits for when the child's last event is its own
            ``suspended``, and ``None`` when it moves on; by default the step's
            ``Blockage`` under the calling tool call (``agent.blockage``).

    Returns:
        The last terminal event this call forwarded (with ``until=None``, the one after
        ``past``); ``None`` when it forwarded none.

    Raises:
        HelixError: the child's service refused the stream or stayed out of reach past
            ``retry``'s deadline; what was forwarded stays forwarded.
    """
    forwarded = _forwarded(ctx)
    note = blocked or _blockage_of(ctx)
    async with forwarded.locks.setdefault(child_id, asyncio.Lock()):
        final: pb.StreamEvent | None = None
        while True:
            last = forwarded.last.get(child_id)
            if last is None:  # nothing forwarded in this run: the log says where it is
                last = (await forwarded_so_far(ctx).child(child_id)).last_sequence
                forwarded.last[child_id] = last
            if until is not None and last >= until:
                return final
            if rejoining:
                rejoining = False
                await _blocked_already(client, child_id, last, note)
            ended = await _forward_stream(
                ctx, forwarded, child_id, tool_call_id, client, retry, last, until, note
            )
            if ended is None:
                # The child finished and the log holds all of it; or, after `until`, a
                # stream cut short at it.
                return final
            if is_terminal(ended):
                final = ended
                if until is None and ended.sequence > past:
                    return final


async def _forward_stream(
    ctx: ToolContext,
    forwarded: ForwardedByRun,
    child_id: str,
    tool_call_id: str,
    client: AgentClient,
    retry: RetryConfig | None,
    last: int,
    until: int | None,
    note: Blocked,
) -> pb.StreamEvent | None:
    """One stream from ``last``: to the child's next terminal event, or to ``until``.
    Returns the last event forwarded (``None``: none)."""
    emit, emit_encoded = ctx.emit, ctx.run.emit_encoded
    prefix = child_event_prefix(tool_call_id)
    totals = ctx.run.cache.child_totals
    final: pb.StreamEvent | None = None
    # A batch at a time: this loop runs once per child event on the parent, the busiest
    # process of a delegation, so it does no per-event work it can share.
    # Shared: a parent's children on one service ride one ``Follow`` call, not a
    # ``Stream`` each (~60 KB of gRPC state a child, between the two processes).
    stream = client.stream(child_id, from_sequence=last, retry=retry, shared=True)
    async for batch, encoded in stream.encoded_batches():
        payloads = child_event_payloads(prefix, encoded)
        if emit_encoded is not None:
            emit_encoded(payloads)
        else:
            for payload in payloads:
                emit(pb.StreamEvent.FromString(payload))
        # Emitted (in the writer, flushed with the run's next write) and noted at once,
        # with no await between: a cancellation cannot split them.
        final = batch[-1]
        forwarded.last[child_id] = final.sequence
        note(_suspended_child(client, final))
        if is_terminal(final):
            totals.note(final)
            break  # the stream would end here anyway; a continued child goes on after it
        if until is not None and final.sequence >= until:
            break
    return final


def _blockage_of(ctx: ToolContext) -> Blocked:
    """Report to the step's ``Blockage`` under the running tool call (none: ignored)."""
    call_id, blockage = ctx.tool_call_id, ctx.run.blockage

    def note(child: BlockedChild | None) -> None:
        if not call_id:
            return
        if child is None:
            blockage.unblock(call_id)
        else:
            blockage.block(call_id, child)

    return note


def _suspended_child(client: AgentClient, last: pb.StreamEvent) -> BlockedChild | None:
    """The child, when its last event so far is its own ``suspended``: waiting for input.
    Any later event of it means it moved on."""
    if last.WhichOneof("payload") != "suspended":
        return None
    return BlockedChild(
        child_session_id=last.session_id, address=client.address, last_sequence=last.sequence
    )


async def _blocked_already(client: AgentClient, child_id: str, last: int, note: Blocked) -> None:
    """Best effort: a child out of reach now is followed as before (its stream retries
    without a deadline); only a ``suspended`` seen later will count it as blocked then."""
    try:
        status = await client.get_status(child_id)
    except HelixError:
        return  # never an outcome: the stream decides what an unreachable child means
    if status.status == pb.SESSION_STATUS_SUSPENDED and status.last_sequence <= last:
        note(BlockedChild(child_session_id=child_id, address=client.address, last_sequence=last))


def status_of(terminal: pb.StreamEvent) -> pb.GetStatusResponse:
    """How a child's turn ended, as ``GetStatus`` would say it, from its terminal event."""
    kind = terminal.WhichOneof("payload")
    if kind == "completed":
        return pb.GetStatusResponse(
            status=pb.SESSION_STATUS_COMPLETED, output_json=terminal.completed.output_json
        )
    if kind == "failed":
        return pb.GetStatusResponse(
            status=pb.SESSION_STATUS_FAILED,
            error=terminal.failed.error,
            failure_reason=terminal.failed.failure_reason,
        )
    if kind == "interrupted":
        return pb.GetStatusResponse(status=pb.SESSION_STATUS_INTERRUPTED)
    return pb.GetStatusResponse(status=pb.SESSION_STATUS_TERMINATED)


# --- what the parent's log holds (a resumed parent's truth) ----------------------------


async def start_logged(ctx: ToolContext, child_id: str, *, turn: int = 1) -> bool:
    """True when the parent's log holds the ``subagent_start`` of ``child_id``'s turn
    ``turn`` (one start per turn, whichever call began it): a call re-run by a resumed
    parent must not write it again. Ask only when the child's ref existed before the
    call (refs are saved before the event)."""
    return (await forwarded_so_far(ctx).child(child_id)).starts >= turn


async def ends_logged(ctx: ToolContext, child_ids: Iterable[str]) -> dict[str, int]:
    """How many ``subagent_end``s of each of ``child_ids`` the parent's log holds (one
    per turn delivered): a delivery re-run by a resumed parent must not log one twice."""
    index = forwarded_so_far(ctx)
    await index.logged("")
    return {child_id: index.child_so_far(child_id).ends for child_id in child_ids}


def forwarded_so_far(ctx: ToolContext) -> ForwardedSoFar:
    """The run's ``ForwardedSoFar`` (one per run, ``RunCache.log_index``)."""
    index = ctx.run.cache.log_index
    if index is None:
        index = ctx.run.cache.log_index = ForwardedSoFar(ctx.run.store, ctx.session_id)
    return index
