"""How a run ends: its terminal event and its record's update in one write, each
session's running children given their close policies first (``agent._closing``).

``RunLoop`` decides that a run ends and how; this writes it. The subtree's usage comes
from the children's terminal events in the session's own log, never from asking their
services, so a resumed run counts each child once.
"""

from __future__ import annotations

import logging

from helix_transport._events import SessionStatus
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._secrets import redact
from helix_transport.agent._closing import close_children
from helix_transport.agent._steps import RunProgress, storable
from helix_transport.agent._tool_runner import clipped
from helix_transport.agent.definition import Agent
from helix_transport.log import SessionWriter
from helix_transport.store import (
    Checkpoint,
    ChildCommand,
    Interrupt,
    SessionUpdate,
    Store,
    storable_text,
)
from helix_transport.tree import ChildTotals, token_usage

logger = logging.getLogger("helix.loop")


class Endings:
    """The terminal writes of one run (``complete``, ``fail``, ``interrupted``)."""

    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str,
        store: Store,
        writer: SessionWriter,
        totals: ChildTotals,
    ) -> None:
        self.agent = agent
        self.session_id = session_id
        self.store = store
        self.writer = writer
        self.totals = totals
        self.read_log_first = True
        """Read the children's ends from the log before totalling (a resumed run, or a
        later turn); until the run knows, the safe default."""
        self.children_possible = True
        """False while the session can have no child: the run began it (nothing older
        in its log) and has made no ``ToolContext``, which every writer of a child's ref
        holds (delegation, companions, A2A calls). Its end then reads no refs: one store
        round trip less before the terminal write. Until the run knows, True."""
        self.closing: list[ChildCommand] = []
        """The outbox commands the run's end recorded for its children (its close
        policies): the server delivers them once the end is written."""

    async def record_close(
        self, state: RunProgress | None, status: SessionStatus, *, reason: str = ""
    ) -> None:
        """Each running child's close policy, durable before the end (``agent._closing``);
        its events go in the terminal write (emitted deferred: no await may follow).
        ``reason``: the interrupt's that ends the run, passed on to the children."""
        if not self.children_possible:
            self.closing = []
            return
        closing = await close_children(
            self.agent,
            self.store,
            session_id=self.session_id,
            status=status,
            run=None if state is None else state.run,
            reason=reason,
        )
        self.closing = closing.commands
        for event in closing.events:
            self.writer.emit(event, defer=True)

    async def usage(self, state: RunProgress) -> dict[str, pb.TokenUsage]:
        """A terminal event's ``usage`` and ``total_usage``: the subtree from the children's
        terminal events in this session's log, never from asking their services."""
        children = self.totals
        if self.read_log_first:
            await children.read_log(self.store, self.session_id)
        return {
            "usage": token_usage(state.usage),
            "total_usage": token_usage(state.usage + children.total()),
        }

    async def complete(
        self, state: RunProgress, output_json: str, *, limit: str = ""
    ) -> SessionStatus:
        usage = await self.usage(state)  # before the deferred output: no await between
        await self.record_close(state, SessionStatus.COMPLETED)
        self.writer.emit(pb.StreamEvent(output=pb.Output(output_json=output_json)), defer=True)
        completed = pb.Completed(output_json=output_json, limit_exceeded=limit, **usage)
        await self.writer.finish(
            pb.StreamEvent(completed=completed),
            SessionUpdate(
                status=SessionStatus.COMPLETED,
                output_json=output_json,
                step_count=state.step,
                usage=state.usage,
                limit_exceeded=limit,
            ),
            # The whole conversation, its last step included: what a new turn
            # (Continue) starts from. It rides with the end: still one write.
            checkpoint=Checkpoint(
                session_id=self.session_id,
                step=state.step,
                messages=state.messages,
                usage=state.usage,
                state=storable(state),
            ),
        )
        return SessionStatus.COMPLETED

    async def fail(self, state: RunProgress, error: str, reason: str) -> SessionStatus:
        # The event says what the record will. A provider's error may echo a credential
        # (an API key): redacted here, where it is stored and returned by GetStatus.
        error = clipped(redact(storable_text(error)))
        state.error = error
        # What an operator acts on: the reason (a stable word) and the status's error.
        logger.warning(
            "session %s failed (%s): %s",
            self.session_id,
            reason,
            error,
            extra={"status": SessionStatus.FAILED.value, "reason": reason, "error": error},
        )
        usage = await self.usage(state)
        await self.record_close(state, SessionStatus.FAILED)
        await self.writer.finish(
            pb.StreamEvent(failed=pb.Failed(error=error, failure_reason=reason, **usage)),
            SessionUpdate(
                status=SessionStatus.FAILED,
                error=error,
                failure_reason=reason,
                step_count=state.step,
                usage=state.usage,
            ),
        )
        return SessionStatus.FAILED

    async def interrupted(
        self, state: RunProgress, interrupt: Interrupt, *, limit: str = ""
    ) -> SessionStatus:
        usage = await self.usage(state)
        if interrupt.abort:  # never to be resumed: its pending requests go with it
            event = pb.StreamEvent(terminated=pb.Terminated(reason=interrupt.reason, **usage))
            status = SessionStatus.TERMINATED
        else:
            stopped = pb.Interrupted(reason=interrupt.reason, limit_exceeded=limit, **usage)
            event = pb.StreamEvent(interrupted=stopped)
            status = SessionStatus.INTERRUPTED
        await self.record_close(state, status, reason=interrupt.reason)
        update = SessionUpdate(
            status=status, step_count=state.step, usage=state.usage, limit_exceeded=limit
        )
        await self.writer.finish(event, update)
        return status
