"""What a parent records of a child, whatever its kind (remote tool, companion,
``run_subagent`` task): the metadata the child starts with, the events that bracket it
in the parent's log, and its ref in the parent's store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping

from helix_transport._events import SessionStatus
from helix_transport._metadata import (
    MAX_METADATA_VALUE,
    ROOT_SESSION_KEY,
    SESSION_PATH_KEY,
    TRACE_MODE_KEY,
)
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import ToolContext
from helix_transport.store import SubSessionRef


def child_metadata(
    ctx: ToolContext, trace_context: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A child's ``StartRequest.metadata``: the parent's, with the tree's root session id.

    The trace context the parent inherited from its own parent is not passed on: it
    would nest the child's spans under the grandparent's delegation. ``trace_context``
    (this delegation's span) takes its place; without one the child's run is a top
    span of the same trace, which the root session id names.
    """
    lineage = ctx.run.lineage
    # The caller's entries, and the trace mode as before (a child's runs ignore it). Not
    # the delegation path: it travels as StartRequest.delegation_path.
    inherited = (
        {**ctx.metadata, TRACE_MODE_KEY: lineage.trace_mode} if lineage.trace_mode else ctx.metadata
    )
    metadata = {
        **inherited,
        ROOT_SESSION_KEY: lineage.root_session_id or ctx.session_id,
        **(trace_context or {}),
    }
    # Where the child's requests for input come from; a path too long for one metadata
    # value (a deep tree of long ids) starts at the child instead.
    path = json.dumps(list(ctx.run.session_path))
    if ctx.run.session_path and len(path) <= MAX_METADATA_VALUE:
        metadata[SESSION_PATH_KEY] = path
    return metadata


def subagent_started(
    *, tool_call_id: str, child_id: str, agent_type: str, address: str
) -> pb.StreamEvent:
    """The parent's log entry for a child it starts (or rejoins)."""
    return pb.StreamEvent(
        subagent_start=pb.SubagentStart(
            tool_call_id=tool_call_id,
            child_session_id=child_id,
            child_agent_type=agent_type,
            address=address,
        )
    )


def subagent_ended(
    *,
    tool_call_id: str,
    child_id: str,
    agent_type: str,
    status: SessionStatus,
    output_json: str = "",
    error: str = "",
) -> pb.StreamEvent:
    """The parent's log entry for a child's outcome."""
    return pb.StreamEvent(
        subagent_end=pb.SubagentEnd(
            tool_call_id=tool_call_id,
            child_session_id=child_id,
            child_agent_type=agent_type,
            status=status.to_proto(),
            output_json=output_json,
            error=error,
        )
    )


async def save_child_ref(
    ctx: ToolContext,
    *,
    child_id: str,
    agent_type: str,
    tool_call_id: str,
    status: SessionStatus,
    address: str,
    output_json: str = "",
    error: str = "",
) -> None:
    """Record a child of the companions or of dispatch in the parent's refs.

    A running child's ref is what makes the parent's ``Interrupt`` cascade to it.
    """
    await ctx.run.store.put_subsession_ref(
        SubSessionRef(
            parent_session_id=ctx.session_id,
            child_session_id=child_id,
            agent_type=agent_type,
            tool_call_id=tool_call_id,
            status=status,
            address=address,
            completed_at=None if status is SessionStatus.RUNNING else time.time(),
            output_json=output_json,
            error=error,
        )
    )


async def record_child_end(
    ctx: ToolContext,
    ref: SubSessionRef,
    *,
    status: SessionStatus,
    output_json: str = "",
    error: str = "",
) -> SubSessionRef:
    """A call's child ended: the delegation hook, ``subagent_ended`` in the parent's log,
    and the ref saved ended; returns that ref.

    The log and the ref are written side by side, not one after the other: after a
    crash the parent's log, not the ref, says what was forwarded (``ForwardedSoFar``),
    so either may land first.
    """
    ctx.run.hooks.on_delegation_end(
        tool_call_id=ctx.tool_call_id,
        child_session_id=ref.child_session_id,
        status=status,
        error=error,
    )
    ctx.emit(
        subagent_ended(
            tool_call_id=ctx.tool_call_id,
            child_id=ref.child_session_id,
            agent_type=ref.agent_type,
            status=status,
            output_json=output_json,
            error=error,
        )
    )
    ended = dataclasses.replace(
        ref, status=status, output_json=output_json, error=error, completed_at=time.time()
    )
    await asyncio.gather(ctx.run.flush(), ctx.run.store.put_subsession_ref(ended))
    return ended
