"""Delivering finished turns to the parent's model, and queued messages to children."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from helix_transport._exceptions import HelixError, SessionExists, SessionStateConflict
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.tools import (
    ToolContext,
)
from helix_transport.delegation.companions._lifecycle import Lifecycle
from helix_transport.delegation.companions._roster import PREFIX, Child, Children
from helix_transport.delegation.forwarding import UNFINISHED, ends_logged
from helix_transport.delegation.spans import reopen_delegations


class Delivery(Lifecycle):
    # --- delivery ---------------------------------------------------------------------

    async def deliver_finished(
        self, ctx: ToolContext, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The step hook: one message about every child that finished undelivered."""
        await reopen_delegations(ctx)  # the spans of children a stopped run left open
        children = Children(ctx.run.state.companions).all()
        plain = [c for c in children if not c.delivered and not c.inbox]
        queued = [c for c in children if c.inbox]
        if not plain and not queued:
            return []
        await asyncio.gather(*(self._refresh(ctx, c) for c in plain))
        ended = [c for c in plain if c.status != "running"]
        if ended:  # the ends a resumed parent logged before its crash (see _delivered)
            await ends_logged(ctx, [c.session_id for c in ended])
        lines = [self._notify(ctx, c) for c in ended]
        for handed in await asyncio.gather(*(self._hand_over(ctx, c) for c in queued)):
            lines.extend(handed)
        if not lines:
            return []
        return [{"role": "user", "content": "[sub-agent notifications]\n" + "\n".join(lines)}]

    def _notify(self, ctx: ToolContext, child: Child) -> str:
        """Deliver a finished turn's outcome as a notification line."""
        self._delivered(ctx, child)
        if child.status == "completed":
            return (
                f"Sub-agent {child.name!r} ({child.agent_type}) completed with result: "
                f"{child.output_json}"
            )
        return (
            f"Sub-agent {child.name!r} ({child.agent_type}) {child.status}: "
            f"{child.error or 'no output'}"
        )

    async def _hand_over(self, ctx: ToolContext, child: Child) -> list[str]:
        """Ask for the child's next turn with its queue; notification lines of what came
        of it (see "Queued messages" in the module docstring)."""
        name, count = child.name, len(child.inbox)
        try:
            client = await ctx.run.clients.get(child.address)
            # Asked only once the child is not running: a status is one record read, where
            # a Continue, refused while the turn runs, also reads the checkpoint and log.
            status = await client.get_status(child.session_id)
            if status.status in UNFINISHED:
                return []
            if status.status != pb.SESSION_STATUS_COMPLETED:
                # Only a completed turn takes the queue (its service would resume an
                # interrupted one with its memory; a companion's starts over).
                raise SessionStateConflict(child.session_id, f"{status.status}: not completed")
            replaced = await self._running_ref(ctx, child)
            try:
                reply = await client.continue_session(
                    child.session_id, "\n\n".join(child.inbox), turn=child.turn + 1
                )
            except (SessionStateConflict, SessionExists):
                await self._put_back(ctx, replaced)  # refused: no turn of ours began
                raise
        except SessionStateConflict as exc:
            if "still running" in exc.problem:
                return []  # a turn started since the status: asked again at the next step
            # The turn ended other than completed: its end is the child's status now.
            await self._refresh(ctx, child)
            if child.status == "running":  # that status could not be read: next step
                return []
            lines = [] if child.delivered else [self._notify(ctx, child)]
            child.inbox = []
            Children(ctx.run.state.companions).put(child)
            return [
                *lines,
                f"Sub-agent {name!r}: your {count} queued message(s) were dropped, as its "
                f"turn did not complete; re-spawn it with {PREFIX}spawn_agent.",
            ]
        except SessionExists:  # someone else started that turn with other messages
            child.inbox = []
            Children(ctx.run.state.companions).put(child)
            return [f"Sub-agent {name!r}: your {count} queued message(s) were dropped, as "
                    "another caller started its next turn."]  # fmt: skip
        except HelixError:
            return []  # unreachable for now: still queued, asked again at the next step
        lines = []
        if not child.delivered:
            if child.status == "running":  # its end not seen yet: the event before the turn
                try:
                    await self._record_end(client, child, reply.from_sequence)
                except HelixError:
                    return []  # asked again at the next step: a replay, then this read
            lines.append(self._notify(ctx, child))
        following = dataclasses.replace(
            child,
            turn=child.turn + 1,
            from_sequence=reply.from_sequence,
            status="running",
            error="",
            delivered=False,
            inbox=[],
        )
        await self._began(ctx, following)
        lines.append(
            f"Sub-agent {name!r} got your {count} queued message(s): its turn "
            f"{following.turn} is running."
        )
        return lines
