"""What a ``run_subagent`` task leaves behind: its report to the parent's model, its ref,
its span's end and its ``subagent_ended`` event (``dispatch`` decides when)."""

from __future__ import annotations

import json
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport.agent.state import DispatchBatch, DispatchState, DispatchTask
from helix_transport.agent.tools import ToolContext
from helix_transport.delegation.child_records import save_child_ref, subagent_ended
from helix_transport.delegation.spans import end_delegation


def done(batch: DispatchBatch) -> bool:
    """No task of ``batch`` is still running."""
    return all(t.status != "running" for t in batch.tasks)


def report(task: DispatchTask) -> dict[str, Any]:
    """What the parent's model is shown of ``task``."""
    shown: dict[str, Any] = {
        "task_id": task.task_id,
        "agent": task.agent_type,
        "status": task.status,
        "conversation_key": task.conversation_key,
    }
    if task.output_json:
        shown["output"] = json.loads(task.output_json)
    if task.error:
        shown["error"] = task.error
    return shown


def end_span(ctx: ToolContext, task: DispatchTask) -> None:
    """End the task's delegation span."""
    # After the ref's write: a resumed run opens the span again only while the ref says
    # running (see helix_transport.delegation.spans), so it is never exported twice.
    end_delegation(
        ctx,
        child_session_id=task.session_id,
        status=session_status(task),
        error=task.error,
    )


def end_event(ctx: ToolContext, tool_call_id: str, task: DispatchTask) -> None:
    """Log the task's ``subagent_ended``."""
    ctx.emit(
        subagent_ended(
            tool_call_id=tool_call_id,
            child_id=task.session_id,
            agent_type=task.agent_type,
            status=session_status(task),
            output_json=task.output_json,
            error=task.error,
        )
    )


async def save_ref(ctx: ToolContext, task: DispatchTask) -> None:
    """Save the task's child ref as it stands."""
    # A running task's ref also makes the stream's heartbeat count it.
    await save_child_ref(
        ctx,
        child_id=task.session_id,
        agent_type=task.agent_type,
        tool_call_id=task.task_id,
        status=session_status(task),
        address=task.address,
        output_json=task.output_json,
        error=task.error,
    )


def session_status(task: DispatchTask) -> SessionStatus:
    """The task's status as a session status."""
    # "timed_out" is the dispatcher's own word; the log and the ref say failed.
    return SessionStatus.FAILED if task.status == "timed_out" else SessionStatus(task.status)


def latest(state: DispatchState, session_id: str) -> DispatchTask | None:
    """The last task of ``session_id``'s conversation this run recorded."""
    tasks = [t for b in state.batches for t in b.tasks if t.session_id == session_id]
    return max(tasks, key=lambda t: t.turn, default=None)
