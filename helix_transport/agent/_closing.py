"""A parent's end, for its children: each close policy carried out, crash-safe.

Before a run's terminal write, ``close_children`` reads the children its refs say are
still running and, by each one's declared policy (``agent.close_policy``):

- puts a ``close`` command in the outbox for each child to terminate (an ``abort``,
  when the parent is aborted): durable *before* the terminal write. The outbox delivers
  a ``close`` only once the parent's session is terminal (``delegation.cascade``), so a
  parent killed between the two writes, resumed and going on, has not stopped its
  children by accident; once it ends, whoever runs the outbox (this process after the
  run, a restarted one, another replica) interrupts them;
- returns one ``close_policy_applied`` event per child, which the caller emits in the
  same atomic write as its terminal event: the log says what the policy did exactly
  when the end is durable.

A ``WAIT`` child still running here is terminated: the parent's completion waited for
it already (``FinishHook``), or the parent failed or was interrupted and cannot wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.close_policy import ClosePolicy, applied
from helix_transport.agent.definition import Agent
from helix_transport.agent.state import RunState
from helix_transport.store import ChildCommand, Store


@dataclass(kw_only=True)
class Closing:
    """What ``close_children`` decided: the events to log, the commands to deliver."""

    events: list[pb.StreamEvent] = field(default_factory=list)
    commands: list[ChildCommand] = field(default_factory=list)


async def close_children(
    agent: Agent,
    store: Store,
    *,
    session_id: str,
    status: SessionStatus,
    run: RunState | None,
    reason: str = "",
) -> Closing:
    """Record the outbox commands for the children of ``session_id`` still running as
    its turn ends with ``status``; return them and the events to log with the end.

    ``reason`` is the interrupt's, when one ended the turn: the children are told it,
    as the ``Interrupt``'s own cascade tells them, so that whichever of the two asks
    reaches a child first, it stops with the words the person gave."""
    closing = Closing()
    refs = [r for r in await store.list_subsession_refs(session_id) if not r.status.is_terminal]
    if not refs:
        return closing
    inboxes = {} if run is None else _inboxes(run)
    why = f"parent {session_id} {status.value}"
    for ref in refs:
        policy = agent.close_policy_of(session_id, ref.child_session_id, ref.agent_type)
        if status is SessionStatus.TERMINATED:
            action = pb.CLOSE_ACTION_ABORTED
        elif policy is ClosePolicy.ABANDON:
            action = pb.CLOSE_ACTION_ABANDONED
        else:
            action = pb.CLOSE_ACTION_TERMINATED
        if action != pb.CLOSE_ACTION_ABANDONED and ref.address:
            closing.commands.append(
                ChildCommand(
                    parent_session_id=session_id,
                    child_session_id=ref.child_session_id,
                    address=ref.address,
                    kind="abort" if action == pb.CLOSE_ACTION_ABORTED else "close",
                    reason=reason or why,
                )
            )
        closing.events.append(
            applied(
                child_session_id=ref.child_session_id,
                agent_type=ref.agent_type,
                policy=policy,
                action=action,
                reason=why,
                # A queue for a companion is only ever sent at a later step of the
                # parent: at its end, it is reported, not silently lost.
                undelivered=inboxes.get(ref.child_session_id, 0),
            )
        )
    if closing.commands:
        await store.put_commands(closing.commands)
    return closing


def _inboxes(run: RunState) -> dict[str, int]:
    """Messages queued for each companion, by its session id."""
    return {
        child.session_id: len(child.inbox)
        for child in run.companions.children.values()
        if child is not None and child.inbox
    }
