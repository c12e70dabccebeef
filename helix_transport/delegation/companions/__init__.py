"""Persistent children: long-lived remote agents a parent spawns, re-consults and reaps.

A parent declares the child agent types it may keep (``PersistentChild``), each
``blocking`` or ``non-blocking``, and ``with_companions`` gives its model six
tools (the ``companion__`` prefix keeps them apart from the agent's own)::

    companion__spawn_agent(agent, message, name?)   start a child, or re-consult it
    companion__send_message(name, message)          a new turn, now or when the current ends
    companion__list_children()                      names, types, statuses
    companion__get_child_status(name)               status and last output
    companion__terminate_child(name)                stop a running child
    companion__wait_for_result(name, timeout_s?)    only when a blocking type exists

Malformed calls (an empty or over-long name, an empty message, a timeout that is
not positive, an unknown type or child) are error tool results; nothing raises.
Calls on one child in one step run one at a time, in the order the model made them.

**Identity.** A child lives in session ``{parent_session_id}-agent-{name}-{scope}`` on its
type's service (``HELIX_AGENT_ADDRESS_<TYPE>``). Unnamed children are named
``{agent_type}-{n}``; names are taken synchronously, before a tool's first await,
so concurrent spawns in one step never collide, and a resumed step re-running the
same calls in the same order takes the same names.

**Turns.** The first message starts the child with ``{input_field: message}`` as
its input. Spawning an existing name, or ``send_message``, continues the same
session with ``Continue`` (one new turn, fresh step budget): a completed child
keeps its memory; a failed, interrupted or terminated one re-spawns fresh (same
session, its log goes on, the conversation starts over). Spawning a child whose
turn is still running is an ``already running`` error. Turns are numbered by the
parent, so a parent that re-runs a spawn after a crash rejoins the turn it started
(also when its checkpoint still showed the turn before running). A child is recorded
as running before each ``Start`` or ``Continue``, so an interrupt of the parent
cascades to a turn still being asked for.

**Queued messages.** ``send_message`` to a child whose turn is running queues the
message (at most ``MAX_INBOX``) in the parent run's state. At the start of each
parent step the delivery hook asks the child's status; once the child is not
running (and its service can be reached), the hook asks for the next turn with the
queue (``Continue``, the messages joined by blank lines, in order): if the turn
completed, the queue becomes the next turn and the parent's model is told of both.
A turn that ends any other way (a companion's next turn keeps memory only after a
completed one, though a service would resume an interrupted session with it), or a
terminate, drops the queue and says how many messages were dropped. Only the hook hands a queue over, right after a checkpoint, so a parent
resumed after a crash asks again with the same turn and message (once the child is
not running: the turn it started may still run), and the child's service replays
the turn already started: the hook then reads how the turn before ended from the
event just before it, not from the child's status (by then the new turn's).

**Exactly-once delivery.** Each finished turn's outcome reaches the parent's
model once: *pulled* as a tool result (a blocking spawn, ``wait_for_result``,
``get_child_status`` or ``terminate_child`` showing the outcome), or *pushed* by
a step hook as one message at the start of the parent's next fresh step, for
every child that finished meanwhile. The delivery mark lives in the parent run's
``ToolContext.state``, which is checkpointed in the same write as the
conversation that holds the delivered outcome: a parent killed before that write
delivers again from the earlier checkpoint (its model never saw the first try),
one killed after it never delivers again. Terminated children are not pushed
(the parent stopped them on purpose). A new message (``send_message``, or a spawn
that re-consults) to a child whose finished turn the parent's model has not seen
yet shows that outcome in the tool's result (``previous_turn``) before the next
turn starts, so it is not lost. The parent's *log* holds one ``subagent_end``
per turn even so: a delivery again reads the log for an end a crashed run wrote.

**Events.** The parent's log gets ``subagent_start`` when a turn starts and
``subagent_end`` when its outcome is delivered, and the child's events between
as ``child_event``s (``helix_transport.delegation.forwarding``): a waited-for
turn's as they come, a non-blocking one's at each of the parent's steps.
A running child is recorded as a sub-session ref, so interrupting the parent
interrupts it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

from helix_transport._exceptions import HelixError
from helix_transport.agent.definition import Agent
from helix_transport.agent.tools import Tool, ToolContext, ToolError, library_tool
from helix_transport.delegation.companions._children import (
    MAX_INBOX,
    PREFIX,
    TERMINATE_WAIT_S,
    Child,
    Children,
    Mode,
    NameArgs,
    NoArgs,
    PersistentChild,
    SendArgs,
    SpawnArgs,
    WaitArgs,
    child_session_id,
    lock,
)
from helix_transport.delegation.companions._delivery import Delivery
from helix_transport.delegation.companions._lifecycle import with_previous

__all__ = [
    "MAX_INBOX",
    "PREFIX",
    "Companions",
    "Mode",
    "NameArgs",
    "NoArgs",
    "PersistentChild",
    "SendArgs",
    "SpawnArgs",
    "WaitArgs",
    "child_session_id",
    "with_companions",
]


class Companions(Delivery):
    """The companion tools and the delivery hook for a set of persistent child types."""

    def __init__(self, children: Sequence[PersistentChild]) -> None:
        types = [c.agent_type for c in children]
        if not types or len(set(types)) != len(types):
            raise ValueError("declare each persistent child type once, and at least one")
        self.types = {c.agent_type: c for c in children}

    # --- wiring ---------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The tools the parent's model gets (``wait_for_result`` only with a blocking type)."""
        kinds = ", ".join(f"{t} ({c.mode})" for t, c in self.types.items())
        tools = [
            Tool(
                name=f"{PREFIX}spawn_agent",
                description=(
                    f"Start a persistent child agent ({kinds}), or re-consult an existing one "
                    "by name: a completed child remembers earlier rounds. A blocking child's "
                    "result comes back here; a non-blocking child's arrives later as a message."
                ),
                args_model=SpawnArgs,
                fn=self._spawn,
            ),
            Tool(
                name=f"{PREFIX}send_message",
                description=(
                    "Send a child a new message. A finished child starts a new turn with it "
                    "at once; a running one gets it, with any others queued, as its next turn "
                    "when its current turn ends."
                ),
                args_model=SendArgs,
                fn=self._send,
            ),
            Tool(
                name=f"{PREFIX}list_children",
                description="List the persistent children with their statuses.",
                args_model=NoArgs,
                fn=self._list,
            ),
            Tool(
                name=f"{PREFIX}get_child_status",
                description="One child's status and last output.",
                args_model=NameArgs,
                fn=self._status,
            ),
            Tool(
                name=f"{PREFIX}terminate_child",
                description="Stop a running child. A finished child is left as it is.",
                args_model=NameArgs,
                fn=self._terminate,
            ),
        ]
        if any(c.mode == "blocking" for c in self.types.values()):
            tools.append(
                Tool(
                    name=f"{PREFIX}wait_for_result",
                    description="Wait until a child's current turn ends; return its result.",
                    args_model=WaitArgs,
                    fn=self._wait_tool,
                )
            )
        return [library_tool(t) for t in tools]  # their reserved names are theirs

    def attach(self, agent: Agent) -> Agent:
        """``agent`` with the companion tools and the delivery hook added."""
        return dataclasses.replace(
            agent,
            tools=[*agent.tools, *self.tools()],
            step_hooks=[*agent.step_hooks, self.deliver_finished],
        )

    # --- tools -----------------------------------------------------------------------

    async def _spawn(self, ctx: ToolContext, args: SpawnArgs) -> dict[str, Any]:
        config = self.types.get(args.agent)
        if config is None:
            known = ", ".join(self.types)
            raise ToolError(f"unknown persistent agent type {args.agent!r} (known: {known})")
        children = Children(ctx.run.state.companions)
        # The name is taken before the first await: concurrent spawns never share one.
        name = args.name or children.auto_name(args.agent)
        async with lock(ctx, name):
            return await self._spawn_named(ctx, config, args, name)

    async def _spawn_named(
        self, ctx: ToolContext, config: PersistentChild, args: SpawnArgs, name: str
    ) -> dict[str, Any]:
        existing = Children(ctx.run.state.companions).get(name)
        if existing is not None and existing.agent_type != args.agent:
            raise ToolError(f"name {name!r} is taken by a {existing.agent_type} child")
        previous, dropped = None, 0
        if existing is None:
            child = await self._start(ctx, config, name, args.message)
        else:
            await self._refresh(ctx, existing)
            if existing.status == "running":
                child, previous, dropped = await self._rejoin(ctx, existing, args.message)
                return await self._spawned(ctx, config, child, previous, dropped)
            previous = self._unseen_outcome(ctx, existing)
            # A completed child takes its queued messages first; a fresh one drops them.
            queued = existing.inbox if existing.status == "completed" else []
            dropped = len(existing.inbox) - len(queued)
            message = "\n\n".join([*queued, args.message])
            child = await self._continue_showing(
                ctx, dataclasses.replace(existing, inbox=[]), message, previous
            )
        return await self._spawned(ctx, config, child, previous, dropped)

    async def _spawned(
        self,
        ctx: ToolContext,
        config: PersistentChild,
        child: Child,
        previous: dict[str, Any] | None,
        dropped: int,
    ) -> dict[str, Any]:
        """A spawn's result: the child's new turn, waited for when it blocks."""
        result: dict[str, Any]
        if config.mode == "non-blocking":
            result = {"name": child.name, "status": "running", "session_id": child.session_id}
        else:
            try:
                result = await self._await_turn(ctx, child, timeout_s=None)
            except HelixError as exc:  # its service out of reach past the retry deadline
                problem = f"{child.name!r} began its turn, but its result could not be read"
                raise ToolError(with_previous(f"{problem}: {exc.message}", previous)) from exc
        if previous is not None:
            result["previous_turn"] = previous
        if dropped:
            result["dropped_messages"] = dropped
        return result

    async def _send(self, ctx: ToolContext, args: SendArgs) -> dict[str, Any]:
        async with lock(ctx, args.name):
            return await self._send_locked(ctx, args)

    async def _send_locked(self, ctx: ToolContext, args: SendArgs) -> dict[str, Any]:
        child = self._known(ctx, args.name)
        await self._refresh(ctx, child)
        if child.status == "running":
            if len(child.inbox) >= MAX_INBOX:
                raise ToolError(
                    f"child {child.name!r} already has {MAX_INBOX} messages queued; wait for "
                    "its turn to end"
                )
            child.inbox.append(args.message)
            Children(ctx.run.state.companions).put(child)
            return {
                "name": child.name,
                "status": "running",
                "queued": len(child.inbox),
                "detail": "queued: the child gets it as its next turn when this one ends",
            }
        if child.status != "completed":
            raise ToolError(
                f"child {child.name!r} {child.status}; use {PREFIX}spawn_agent to re-spawn it"
            )
        previous = self._unseen_outcome(ctx, child)
        message = "\n\n".join([*child.inbox, args.message])  # queued ones first, in order
        child = await self._continue_showing(
            ctx, dataclasses.replace(child, inbox=[]), message, previous
        )
        result = {"name": child.name, "delivered": True, "status": "running", "turn": child.turn}
        return result if previous is None else {**result, "previous_turn": previous}

    async def _list(self, ctx: ToolContext, args: NoArgs) -> list[dict[str, Any]]:
        async def one(name: str) -> Child | None:
            async with lock(ctx, name):
                child = Children(ctx.run.state.companions).get(name)  # as the calls before left it
                if child is not None:
                    await self._refresh(ctx, child)
                return child

        names = [c.name for c in Children(ctx.run.state.companions).all()]
        children = [c for c in await asyncio.gather(*map(one, names)) if c is not None]
        return [{"name": c.name, "agent": c.agent_type, "status": c.status} for c in children]

    async def _status(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        async with lock(ctx, args.name):
            child = self._known(ctx, args.name)
            await self._refresh(ctx, child)
            if child.status != "running":
                self._delivered(ctx, child)  # the model sees the outcome here
            return child.view()

    async def _terminate(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        async with lock(ctx, args.name):
            return await self._terminate_locked(ctx, args)

    async def _terminate_locked(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        child = self._known(ctx, args.name)
        await self._refresh(ctx, child)
        if child.status == "running":
            client = await ctx.run.clients.get(child.address)
            reply = await client.interrupt(child.session_id, reason="terminated by its parent")
            if reply.accepted:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TERMINATE_WAIT_S):
                        await self._follow(ctx, child)
                if child.status in ("interrupted", "running"):
                    child.status = "terminated"
            else:
                await self._refresh(ctx, child)
        terminated = child.status == "terminated"
        dropped, child.inbox = len(child.inbox), []  # a terminated child gets no next turn
        Children(ctx.run.state.companions).put(child)
        self._delivered(ctx, child)
        shown = {**child.view(), "terminated": terminated}
        return {**shown, "dropped_messages": dropped} if dropped else shown

    async def _wait_tool(self, ctx: ToolContext, args: WaitArgs) -> dict[str, Any]:
        async with lock(ctx, args.name):
            child = self._known(ctx, args.name)
            return await self._await_turn(ctx, child, timeout_s=args.timeout_s)


def with_companions(agent: Agent, children: Sequence[PersistentChild]) -> Agent:
    """``agent`` with persistent children of the given types (see the module docstring)."""
    return Companions(children).attach(agent)
