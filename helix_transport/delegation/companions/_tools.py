"""The companion tools: the ``Companions`` class the package exports, its wiring and
its model-facing tools (spawn, send, status, list, terminate, wait).

How they behave is the package docstring's (``helix_transport.delegation.companions``);
delivering outcomes is ``_delivery``, a child's turns ``_lifecycle``.
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
from helix_transport.delegation.companions._delivery import Delivery
from helix_transport.delegation.companions._lifecycle import with_previous
from helix_transport.delegation.companions._roster import (
    MAX_INBOX,
    PREFIX,
    TERMINATE_WAIT_S,
    Child,
    Children,
    NameArgs,
    NoArgs,
    PersistentChild,
    SendArgs,
    SpawnArgs,
    WaitArgs,
    lock,
)


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
        kinds = "\n".join(
            f"- {t} ({c.mode}): {c.description or '(no description)'}"
            for t, c in self.types.items()
        )
        tools = [
            Tool(
                name=f"{PREFIX}spawn_agent",
                description=(
                    "Start a persistent child agent, or re-consult an existing one by name: "
                    "a completed child remembers earlier rounds. A blocking child's result "
                    "comes back here; a non-blocking child's arrives later as a message.\n"
                    f"Child agents (agent (mode): what it does):\n{kinds}"
                ),
                args_model=SpawnArgs,
                fn=self._spawn,
            ),
            Tool(
                name=f"{PREFIX}send_message",
                description=(
                    "Send a child a new message. A completed or interrupted child starts a "
                    "new turn with it at once (delivered: true), its memory kept; a running "
                    "one gets it, with any others queued, as its next turn when its current "
                    "turn ends (delivered: false until then)."
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
            children=[*agent.children, *(c.declaration() for c in self.types.values())],
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
                "delivered": False,  # not yet: it waits for the turn to end
                "queued": len(child.inbox),
                "detail": "queued: the child gets it as its next turn when this one ends",
            }
        # An interrupted child goes on with its memory, as a completed one does (Continue
        # allows both); a failed or terminated one's conversation is over.
        if child.status not in ("completed", "interrupted"):
            raise ToolError(
                f"child {child.name!r} {child.status}: its conversation cannot go on with its "
                f"memory; use {PREFIX}spawn_agent to re-spawn it fresh"
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
