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
completed, the queue becomes the next turn and the parent's model is told of both. A turn that ends any other way (which a ``Continue`` keeping
memory refuses), or a terminate, drops the queue and says how many messages were
dropped. Only the hook hands a queue over, right after a checkpoint, so a parent
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
turn starts, so it is not lost. The parent's *log* may show a
``subagent_end`` twice across such a crash, like any event of a cut-off step.

**Events.** The parent's log gets ``subagent_start`` when a turn starts and
``subagent_end`` when its outcome is delivered; the child's own events stay in
the child's log (stream the child's session on its service to watch it live).
A running child is recorded as a sub-session ref, so interrupting the parent
interrupts it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from helix_transport._config import RetryConfig
from helix_transport._delegations import end_delegation, open_delegation, reopen_delegations
from helix_transport._events import SessionStatus
from helix_transport._exceptions import HelixError, SessionExists, SessionStateConflict
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.definition import Agent
from helix_transport.agent.tools import (
    Tool,
    ToolContext,
    ToolError,
    derived_session_id,
    library_tool,
    reserve_children,
)
from helix_transport.registry import resolve_address
from helix_transport.remote import (
    child_metadata,
    save_child_ref,
    start_logged,
    subagent_ended,
    subagent_started,
)
from helix_transport.store import SubSessionRef
from helix_transport.transport import AgentClient

PREFIX = "companion__"
STATE_KEY = "helix.companions"
"""Where the companions keep their children in the parent run's state."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
"""Names become part of session ids, so they use the session-id alphabet."""
MAX_INBOX = 16
"""Messages ``send_message`` may queue for a running child's next turn."""
TERMINATE_WAIT_S = 5.0
"""How long ``terminate_child`` waits to see how an interrupted child ended."""

Mode = Literal["blocking", "non-blocking"]


@dataclass(frozen=True, kw_only=True)
class PersistentChild:
    """A child agent type the parent may keep, by registry name."""

    agent_type: str
    """The child's agent type; its service is found in the mesh registry."""
    mode: Mode = "blocking"
    """``blocking``: a spawn waits for the child's result. ``non-blocking``: it returns
    at once and the result arrives as a notification at the parent's next step."""
    input_field: str | None = "message"
    """The first message becomes the child's input ``{input_field: message}``; with
    ``None`` the message must be the child's input JSON itself."""
    address: str | None = None
    """The child service's address; ``None`` looks it up at call time."""
    description: str = ""
    """What the type does, for the parent's model."""


def child_session_id(parent_session_id: str, name: str, scope: str) -> str:
    """The stable session id of the persistent child ``name``.

    ``scope`` is the parent's ``ToolContext.child_scope`` (its agent type and owner).
    """
    return derived_session_id(parent_session_id, "agent", name, scope)


# --- arguments ------------------------------------------------------------------------


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class _Named(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)


class SpawnArgs(BaseModel):
    agent: str = Field(description="The persistent agent type to spawn.")
    message: str = Field(description="The task or message for the child.")
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=NAME_PATTERN,
        description="A name to re-consult the child by; omit to get `{agent}-{n}`.",
    )

    _message = field_validator("message")(_not_blank)


class SendArgs(_Named):
    message: str

    _message = field_validator("message")(_not_blank)


class NameArgs(_Named):
    pass


class WaitArgs(_Named):
    timeout_s: float | None = Field(
        default=None, gt=0, description="Give up waiting after this many seconds."
    )


class NoArgs(BaseModel):
    pass


# --- the children, as the parent run keeps them ----------------------------------------


@dataclass(kw_only=True)
class _Child:
    name: str
    agent_type: str
    session_id: str
    address: str
    tool_call_id: str
    turn: int = 1
    from_sequence: int = 0
    """Where the current turn begins in the child's log."""
    status: str = "running"
    output_json: str = ""
    error: str = ""
    delivered: bool = False
    """The current turn's outcome reached the parent's model."""
    inbox: list[str] = field(default_factory=list)
    """Messages sent while the turn ran, for the next turn (see "Queued messages")."""

    def view(self) -> dict[str, Any]:
        """What the parent's model is shown about the child."""
        shown: dict[str, Any] = {"name": self.name, "agent": self.agent_type, "status": self.status}
        if self.output_json:
            shown["last_output"] = json.loads(self.output_json)
        if self.error:
            shown["error"] = self.error
        if self.inbox:
            shown["queued_messages"] = len(self.inbox)
        return shown

    def outcome(self) -> dict[str, Any]:
        """How the current turn ended, as a tool result shows it."""
        shown: dict[str, Any] = {"status": self.status}
        if self.status == "completed":
            shown["output"] = json.loads(self.output_json)
        elif self.error:
            shown["error"] = self.error
        return shown


class _Children:
    """The ``STATE_KEY`` entry of a run's state, with typed access."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.raw = state.setdefault(STATE_KEY, {"counters": {}, "children": {}})

    def get(self, name: str) -> _Child | None:
        entry = self.raw["children"].get(name)
        return _Child(**entry) if entry is not None else None

    def put(self, child: _Child) -> None:
        self.raw["children"][child.name] = dataclasses.asdict(child)

    def all(self) -> list[_Child]:
        # A None entry is a name reserved by a spawn still starting its child.
        return [_Child(**entry) for entry in self.raw["children"].values() if entry is not None]

    def auto_name(self, agent_type: str) -> str:
        """``{agent_type}-{n}``: the next free n. Synchronous, so never shared."""
        counters = self.raw["counters"]
        while True:
            counters[agent_type] = counters.get(agent_type, 0) + 1
            name = f"{agent_type}-{counters[agent_type]}"
            if name not in self.raw["children"]:
                # Reserve it at once: a concurrent spawn must not pick it too.
                self.raw["children"][name] = None
                return name


_LOCKS_KEY = "helix.companions.locks"


def _lock(ctx: ToolContext, name: str) -> asyncio.Lock:
    """The child's lock in this run: tools on one child run one at a time, in the order
    the model called them, each on the child as the one before left it (concurrent
    calls used to write back stale copies: an outcome marked delivered was unmarked,
    and pushed twice)."""
    locks: dict[str, asyncio.Lock] = ctx.cache.setdefault(_LOCKS_KEY, {})
    return locks.setdefault(name, asyncio.Lock())


class Companions:
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
        children = _Children(ctx.state)
        # The name is taken before the first await: concurrent spawns never share one.
        name = args.name or children.auto_name(args.agent)
        async with _lock(ctx, name):
            return await self._spawn_named(ctx, config, args, name)

    async def _spawn_named(
        self, ctx: ToolContext, config: PersistentChild, args: SpawnArgs, name: str
    ) -> dict[str, Any]:
        existing = _Children(ctx.state).get(name)
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
        child: _Child,
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
                raise ToolError(_with_previous(f"{problem}: {exc.message}", previous)) from exc
        if previous is not None:
            result["previous_turn"] = previous
        if dropped:
            result["dropped_messages"] = dropped
        return result

    async def _send(self, ctx: ToolContext, args: SendArgs) -> dict[str, Any]:
        async with _lock(ctx, args.name):
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
            _Children(ctx.state).put(child)
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
        async def one(name: str) -> _Child | None:
            async with _lock(ctx, name):
                child = _Children(ctx.state).get(name)  # as the calls before left it
                if child is not None:
                    await self._refresh(ctx, child)
                return child

        names = [c.name for c in _Children(ctx.state).all()]
        children = [c for c in await asyncio.gather(*map(one, names)) if c is not None]
        return [{"name": c.name, "agent": c.agent_type, "status": c.status} for c in children]

    async def _status(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        async with _lock(ctx, args.name):
            child = self._known(ctx, args.name)
            await self._refresh(ctx, child)
            if child.status != "running":
                self._delivered(ctx, child)  # the model sees the outcome here
            return child.view()

    async def _terminate(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        async with _lock(ctx, args.name):
            return await self._terminate_locked(ctx, args)

    async def _terminate_locked(self, ctx: ToolContext, args: NameArgs) -> dict[str, Any]:
        child = self._known(ctx, args.name)
        await self._refresh(ctx, child)
        if child.status == "running":
            client = await ctx.clients.get(child.address)
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
        _Children(ctx.state).put(child)
        self._delivered(ctx, child)
        shown = {**child.view(), "terminated": terminated}
        return {**shown, "dropped_messages": dropped} if dropped else shown

    async def _wait_tool(self, ctx: ToolContext, args: WaitArgs) -> dict[str, Any]:
        async with _lock(ctx, args.name):
            child = self._known(ctx, args.name)
            return await self._await_turn(ctx, child, timeout_s=args.timeout_s)

    # --- delivery ---------------------------------------------------------------------

    async def deliver_finished(
        self, ctx: ToolContext, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The step hook: one message about every child that finished undelivered."""
        await reopen_delegations(ctx)  # the spans of children a stopped run left open
        children = _Children(ctx.state).all()
        plain = [c for c in children if not c.delivered and not c.inbox]
        queued = [c for c in children if c.inbox]
        if not plain and not queued:
            return []
        await asyncio.gather(*(self._refresh(ctx, c) for c in plain))
        lines = [self._notify(ctx, c) for c in plain if c.status != "running"]
        for handed in await asyncio.gather(*(self._hand_over(ctx, c) for c in queued)):
            lines.extend(handed)
        if not lines:
            return []
        return [{"role": "user", "content": "[sub-agent notifications]\n" + "\n".join(lines)}]

    def _notify(self, ctx: ToolContext, child: _Child) -> str:
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

    async def _hand_over(self, ctx: ToolContext, child: _Child) -> list[str]:
        """Ask for the child's next turn with its queue; notification lines of what came
        of it (see "Queued messages" in the module docstring)."""
        name, count = child.name, len(child.inbox)
        try:
            client = await ctx.clients.get(child.address)
            # Asked only once the child is not running: a status is one record read, where
            # a Continue, refused while the turn runs, also reads the checkpoint and log.
            status = await client.get_status(child.session_id)
            if status.status in (pb.SESSION_STATUS_RUNNING, pb.SESSION_STATUS_UNSPECIFIED):
                return []
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
            _Children(ctx.state).put(child)
            return [
                *lines,
                f"Sub-agent {name!r}: your {count} queued message(s) were dropped, as its "
                f"turn did not complete; re-spawn it with {PREFIX}spawn_agent.",
            ]
        except SessionExists:  # someone else started that turn with other messages
            child.inbox = []
            _Children(ctx.state).put(child)
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

    async def _record_end(self, client: AgentClient, child: _Child, sequence: int) -> None:
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

    def _delivered(self, ctx: ToolContext, child: _Child) -> None:
        """Mark the turn's outcome delivered (durable with the next checkpoint)."""
        if child.delivered:
            return
        child.delivered = True
        _Children(ctx.state).put(child)
        status = SessionStatus(child.status)
        self._end_span(ctx, child)
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

    # --- the child's lifecycle ---------------------------------------------------------

    async def _start(
        self, ctx: ToolContext, config: PersistentChild, name: str, message: str
    ) -> _Child:
        address = self._address(config)
        child = _Child(
            name=name,
            agent_type=config.agent_type,
            session_id=child_session_id(ctx.session_id, name, ctx.child_scope),
            address=address,
            tool_call_id=ctx.tool_call_id,
        )
        try:
            await reserve_children(ctx, [child.session_id])
        except ToolError:
            _Children(ctx.state).raw["children"].pop(name, None)  # free a reserved name
            raise
        client = await ctx.clients.get(address)
        # One delegation span per child, not per turn: the child keeps the trace context
        # of its Start (Continue carries none), so every turn's run nests under it.
        trace_context = open_delegation(
            ctx, child_session_id=child.session_id, agent_type=child.agent_type
        )
        metadata = child_metadata(ctx, trace_context)
        # The ref before the Start, so that an interrupt cascading while the Start is in
        # flight finds the child (see cascade.Cascade).
        previous = await ctx.store.get_subsession_ref(ctx.session_id, child.session_id)
        await self._save_ref(ctx, child)
        try:
            await client.start(
                _as_input(config, message),
                session_id=child.session_id,
                parent_session_id=ctx.session_id,
                metadata=metadata,
                retry=_until_answered(client),
                delegation_path=ctx.child_delegation_path,
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
                    await ctx.store.put_subsession_ref(previous)
                else:
                    child.status, child.error = "failed", f"could not start: {exc.message}"
                    await self._save_ref(ctx, child)
                raise ToolError(
                    f"child {name!r}: its session exists with another first message"
                ) from None
            child.status, child.error = "failed", f"could not start: {exc.message}"
            await self._save_ref(ctx, child)  # not running: nothing to cascade to
            _Children(ctx.state).raw["children"].pop(name, None)  # free a reserved name
            raise ToolError(f"could not spawn {name!r}: {exc.message}") from exc
        # A spawn re-run by a resumed parent: its subagent_start may be in the log.
        logged = previous is not None and await start_logged(ctx, child.session_id)
        await self._began(ctx, child, ref_saved=True, logged=logged)
        return child

    async def _continue(
        self, ctx: ToolContext, child: _Child, message: str, *, fresh_message: str | None = None
    ) -> _Child:
        """The child's next turn: remembered when it completed, else fresh (its input
        from ``fresh_message``, default ``message``).

        Tried as a continuation first; the service says which it is. A parent
        re-running this call after a crash names the same turn and rejoins it.
        """
        config = self.types[child.agent_type]
        client = await ctx.clients.get(child.address)
        turn = child.turn + 1
        replaced = await self._running_ref(
            ctx, dataclasses.replace(child, tool_call_id=ctx.tool_call_id)
        )
        try:
            try:
                reply = await client.continue_session(
                    child.session_id, message, turn=turn, retry=_until_answered(client)
                )
            except (SessionStateConflict, SessionExists) as exc:
                if isinstance(exc, SessionStateConflict) and "fresh" not in exc.problem:
                    raise
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

    async def _running_ref(self, ctx: ToolContext, child: _Child) -> SubSessionRef | None:
        """Record ``child`` running before asking it for a turn, as ``_start`` does
        before a Start: an interrupt cascading while the request is in flight finds it
        (the turn starts even if the parent stops waiting). Returns the ref replaced."""
        replaced = await ctx.store.get_subsession_ref(ctx.session_id, child.session_id)
        await self._save_ref(ctx, dataclasses.replace(child, status="running", error=""))
        return replaced

    async def _put_back(self, ctx: ToolContext, replaced: SubSessionRef | None) -> None:
        """A turn refused: the child's ref goes back to what it said."""
        if replaced is not None:
            await ctx.store.put_subsession_ref(replaced)

    async def _began(
        self, ctx: ToolContext, child: _Child, *, ref_saved: bool = False, logged: bool = False
    ) -> None:
        """Record the turn begun; ``logged``: its ``subagent_start`` is in the log already."""
        _Children(ctx.state).put(child)
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
        self, ctx: ToolContext, child: _Child, *, timeout_s: float | None
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
        self, ctx: ToolContext, child: _Child, message: str
    ) -> tuple[_Child, dict[str, Any] | None, int]:
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
            client = await ctx.clients.get(child.address)
            await self._record_end(client, ended, following.from_sequence)
        except HelixError:
            return following, None, 0  # how it ended is out of reach; the turn goes on
        previous = self._unseen_outcome(ctx, ended)
        _Children(ctx.state).put(following)  # the entry is the new turn's again
        dropped = len(child.inbox) if ended.status != "completed" else 0
        return following, previous, dropped

    async def _continue_showing(
        self, ctx: ToolContext, child: _Child, message: str, previous: dict[str, Any] | None
    ) -> _Child:
        """``_continue``; when it fails, its error carries ``previous`` (an outcome just
        marked delivered), which would otherwise reach the model through no result."""
        try:
            return await self._continue(ctx, child, message)
        except ToolError as exc:
            if previous is None:
                raise
            raise ToolError(_with_previous(exc.message, previous)) from exc

    def _unseen_outcome(self, ctx: ToolContext, child: _Child) -> dict[str, Any] | None:
        """A finished turn's outcome the parent's model has not seen: shown now, by the
        calling tool's result (and marked delivered); ``None`` when it was seen."""
        if child.status == "running" or child.delivered:
            return None
        self._delivered(ctx, child)
        return child.outcome()

    async def _follow(self, ctx: ToolContext, child: _Child) -> None:
        """Wait for the current turn to end and record how it ended.

        A long poll (``AgentClient.wait``), not the child's stream: the parent keeps
        none of the child's events, so none of them cross the wire to it.
        """
        client = await ctx.clients.get(child.address)
        status = await client.wait(
            child.session_id, from_sequence=child.from_sequence, retry=_until_answered(client)
        )
        await self._record(ctx, child, status)

    async def _refresh(self, ctx: ToolContext, child: _Child) -> None:
        """Bring a running child's status up to date (one ``GetStatus``)."""
        if child.status != "running":
            return
        client = await ctx.clients.get(child.address)
        try:
            status = await client.get_status(child.session_id)
        except HelixError:
            return  # unreachable for now: still "running" as far as we know
        # Terminal, past the start of our turn: the turn we started has ended.
        if (
            status.status not in (pb.SESSION_STATUS_RUNNING, pb.SESSION_STATUS_UNSPECIFIED)
            and status.last_sequence > child.from_sequence
        ):
            await self._record(ctx, child, status)

    async def _record(self, ctx: ToolContext, child: _Child, status: pb.GetStatusResponse) -> None:
        child.status = SessionStatus.from_proto(status.status).value
        child.output_json = status.output_json if child.status == "completed" else ""
        child.error = status.error
        _Children(ctx.state).put(child)
        await self._save_ref(ctx, child)
        self._end_span(ctx, child)

    def _end_span(self, ctx: ToolContext, child: _Child) -> None:
        """End the child's delegation span (open until its first turn ends) when the
        parent learns how the turn ended: recorded (after the ref's write, see
        helix_transport._delegations), or seen otherwise and delivered."""
        if child.status == "running":  # delivered unended (a terminate not seen through)
            return
        end_delegation(
            ctx,
            child_session_id=child.session_id,
            status=SessionStatus(child.status),
            error=child.error,
        )

    async def _save_ref(self, ctx: ToolContext, child: _Child) -> None:
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

    def _known(self, ctx: ToolContext, name: str) -> _Child:
        child = _Children(ctx.state).get(name)
        if child is None:
            known = ", ".join(c.name for c in _Children(ctx.state).all()) or "none"
            raise ToolError(f"no child agent named {name!r} (children: {known})")
        return child

    def _address(self, config: PersistentChild) -> str:
        try:
            return config.address or resolve_address(config.agent_type)
        except HelixError as exc:
            raise ToolError(f"{config.agent_type}: {exc.message}") from exc


def _until_answered(client: AgentClient) -> RetryConfig:
    """Waiting on a child has no deadline of its own: an unreachable child is not a
    failed one (the tool's timeout or the parent's interrupt ends the wait)."""
    return client.config.reconnect.until_cancelled()


def _with_previous(problem: str, previous: dict[str, Any] | None) -> str:
    """An error that also shows the previous turn's outcome, when this call marked it
    delivered: no other result would bring it to the model."""
    if previous is None:
        return problem
    return f"{problem} (its previous turn, not shown before: {json.dumps(previous)})"


def _as_input(config: PersistentChild, message: str) -> str:
    return message if config.input_field is None else json.dumps({config.input_field: message})


def with_companions(agent: Agent, children: Sequence[PersistentChild]) -> Agent:
    """``agent`` with persistent children of the given types (see the module docstring)."""
    return Companions(children).attach(agent)
