"""Non-blocking dispatch: one tool call sends tasks to several remote children at once.

``with_dispatch(agent, [SubagentType(...)], virtual=VirtualTasks())`` gives the parent's
model a ``run_subagent`` tool taking ``{"tasks": [{"agent": ..., "message": ...,
"conversation_key": ..., "context": "new" | "inherit"}, ...]}``, its description listing
every type with what it does (``delegation.subagent_types``). It starts every task's
child (session ``{parent}-task-{tool_call_id}-{i}-{scope}``, so a re-run after a crash
rejoins the same children) and returns their task ids and conversation keys at once;
the parent's model pass goes on. A task naming no agent is *virtual*: a child of the
parent's own type and service, with a subset of its tools. A ``conversation_key`` task is
that child's next turn (``Continue``), checked against the parent's ref of it
(``delegation.conversation_keys``). ``inherit`` sends the parent's conversation, shown in
the child's first turn's model calls and never stored as its history. The results of one call's tasks — one
*batch* — reach the model together, as a single message at the start of a
parent step:

- as soon as every task of the batch has ended, at the next step; or
- when the parent's pass ends (a step without tool calls) while a batch is
  still out: the run *parks* at the start of its next step until the batch is
  done, then goes on in the same run and the same stream. While it waits, it
  follows each running task's stream, forwarding its events into its own log
  (``helix_transport.delegation.forwarding``), so the batch is delivered as its
  last task ends; a quiet stream sends heartbeats (``StreamResponse.heartbeat``,
  not logged). Unparked, each step forwards a running task's events up to where
  its service says it is.

**Deadline.** With ``run_deadline_s``, the run has a wall-clock deadline counted
from the first step of each turn (kept in the checkpointed state, so a restarted
parent keeps it; a continued session gets a fresh one). At the deadline, tasks still running are interrupted and reported as timed
out, together with whatever already finished, and the parent gets one more pass
to give a partial answer; a run still going after that pass fails with
``failure_reason = "deadline"``.

**Exactly once.** Which batches were delivered is in the parent run's state
(``RunState.dispatch``), checkpointed with the conversation that holds them,
as for the companion tools (``helix_transport.delegation.companions``).

**A parent's end** follows each type's ``close_policy`` (``ClosePolicy``):
``TERMINATE`` (the default) interrupts the tasks still out when the parent's turn
ends, however it ends; ``WAIT`` holds a ``__finish__`` while the type's tasks are out:
the run parks until they end (or the deadline passes), their batch reaches the model
as ``[sub-agent results before finishing]`` and the model answers once more, in the same
run; ``ABANDON`` leaves them running (a next turn, ``Continue``, can still get their
results; not a ``fresh`` one). The parent's log records, per task, what was done
(``close_policy_applied``); ``helix_transport.agent._closing`` makes it crash-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from helix_transport._events import SessionStatus
from helix_transport._exceptions import AgentRunError, HelixError, SessionNotFound
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent.blockage import BlockedChild, WaitingForChildren
from helix_transport.agent.close_policy import ClosePolicy, applied
from helix_transport.agent.definition import Agent
from helix_transport.agent.loop import NUDGE
from helix_transport.agent.state import DispatchBatch, DispatchState, DispatchTask
from helix_transport.agent.tools import (
    Tool,
    ToolContext,
    ToolError,
    derived_session_id,
    reserve_children,
)
from helix_transport.delegation.child_records import (
    child_metadata,
    subagent_started,
)
from helix_transport.delegation.conversation_keys import conversation_of, key_of
from helix_transport.delegation.forwarding import (
    UNFINISHED,
    ends_logged,
    forward_child,
    new_child,
    start_logged,
    status_of,
)
from helix_transport.delegation.spans import end_delegation, open_delegation, reopen_delegations
from helix_transport.delegation.starts import start_window
from helix_transport.delegation.subagent_types import (
    MAX_TASKS,
    DispatchArgs,
    SubagentType,
    Task,
    VirtualTasks,
    inherited_context,
    tool_description,
    virtual_tool_names,
)
from helix_transport.delegation.task_records import (
    done,
    end_event,
    end_span,
    latest,
    report,
    save_ref,
)
from helix_transport.registry import resolve_address

UNREACHABLE_PAUSE_S = 0.25
"""While parked, the pause before waiting again for a task whose service stayed
unreachable past the client's reconnect deadline."""
__all__ = ["MAX_TASKS", "Dispatcher", "RunDeadlineExceeded", "SubagentType", "VirtualTasks"]
DEADLINE_TAIL_S = 5.0
"""At the run's deadline, how long to forward an interrupted task's last events."""

_GONE = pb.GetStatusResponse(
    status=pb.SESSION_STATUS_FAILED,
    error="the child session is not found: its service lost it, or no longer lets this "
    "parent see it",
)
"""A task whose service answers NOT_FOUND. Its Start succeeded before it was recorded,
so it existed: waiting on would park the parent for ever."""


class RunDeadlineExceeded(AgentRunError):
    """The run went past its deadline and its one last pass."""

    failure_reason = "deadline"

    def __init__(self, deadline_s: float) -> None:
        super().__init__(f"the run's deadline of {deadline_s:g}s passed")
        self.deadline_s = deadline_s

    def _fields(self) -> dict[str, Any]:
        return {"deadline_s": self.deadline_s}


class Dispatcher:
    """The ``run_subagent`` tool and the step hook that delivers and parks."""

    def __init__(
        self,
        types: Sequence[SubagentType],
        *,
        tool_name: str = "run_subagent",
        run_deadline_s: float | None = None,
        virtual: VirtualTasks | None = None,
    ) -> None:
        if not (types or virtual) or len({t.agent_type for t in types}) != len(types):
            raise ValueError("declare each sub-agent type once, and at least one (or virtual)")
        if run_deadline_s is not None and run_deadline_s <= 0:
            raise ValueError("run_deadline_s must be positive")
        self.types = {t.agent_type: t for t in types}
        self.tool_name = tool_name
        self.run_deadline_s = run_deadline_s
        self.virtual = virtual
        self._virtual_tools: tuple[str, ...] = ()
        """A virtual child's tools (``attach`` settles them against the parent's)."""

    def tool(self) -> Tool:
        """The model-facing dispatch tool."""
        return Tool(
            name=self.tool_name,
            description=tool_description(self.types, self.virtual),
            args_model=DispatchArgs,
            fn=self._dispatch,
        )

    def attach(self, agent: Agent) -> Agent:
        """``agent`` with the dispatch tool and its step hook.

        Raises:
            UsageError: virtual tasks name a tool ``agent`` lacks (or this one), or an
                input field its input model lacks.
        """
        if self.virtual is not None:
            self._virtual_tools = virtual_tool_names(agent, self.virtual, self.tool_name)
        return dataclasses.replace(
            agent,
            tools=[*agent.tools, self.tool()],
            step_hooks=[*agent.step_hooks, self.step],
            children=[*agent.children, *(t.declaration() for t in self.types.values())],
            finish_hooks=[*agent.finish_hooks, self.hold_finish],
        )

    # --- the tool ---------------------------------------------------------------------

    async def _dispatch(self, ctx: ToolContext, args: DispatchArgs) -> dict[str, Any]:
        keys = [t.conversation_key for t in args.tasks if t.conversation_key]
        if len(set(keys)) != len(keys):
            raise ToolError("one task per conversation_key in a call")
        tasks = [
            await self._task(ctx, task, f"{ctx.tool_call_id}-{index}")
            for index, task in enumerate(args.tasks)
        ]
        await reserve_children(ctx, [t.session_id for t in tasks])
        await asyncio.gather(
            *(self._start(ctx, t, a) for t, a in zip(tasks, args.tasks, strict=True))
        )
        batches = ctx.run.state.dispatch.batches
        # A re-run of this call (a resumed parent) replaces its own batch, never adds one.
        batches[:] = [b for b in batches if b.tool_call_id != ctx.tool_call_id]
        batches.append(DispatchBatch(tool_call_id=ctx.tool_call_id, tasks=tasks))
        return {
            "tasks": [
                {
                    "task_id": t.task_id,
                    "agent": t.agent_type,
                    "status": t.status,
                    "conversation_key": t.conversation_key,
                }
                for t in tasks
            ],
            "note": "the results will arrive together in one message when every task is done",
        }

    async def _task(self, ctx: ToolContext, task: Task, task_id: str) -> DispatchTask:
        """The task ``task`` asks for: a new child, or the next turn of a conversation.

        Raises:
            ToolError: an unknown type, no agent without virtual tasks, a key that is not
                this session's, or ``inherit`` on a continued conversation.
        """
        if task.conversation_key:
            if task.context == "inherit":
                raise ToolError(
                    "context 'inherit' is for a new conversation; a continued one has its "
                    "own memory (omit context, or start a new conversation)"
                )
            ref = await conversation_of(ctx, task.conversation_key, task_id=task_id)
            if task.agent is not None and task.agent != ref.agent_type:
                raise ToolError(
                    f"conversation_key is a conversation with {ref.agent_type!r}, not with "
                    f"{task.agent!r}"
                )
            earlier = latest(ctx.run.state.dispatch, ref.child_session_id)
            return DispatchTask(
                task_id=task_id,
                agent_type=ref.agent_type,
                session_id=ref.child_session_id,
                address=ref.address,
                turn=(earlier.turn if earlier else 1) + 1,
                conversation_key=task.conversation_key,
                virtual=bool(earlier and earlier.virtual),
            )
        virtual = task.agent is None
        if virtual and self.virtual is None:
            raise ToolError(f"name an agent for each task (one of: {', '.join(self.types)})")
        if task.agent is not None and task.agent not in self.types:
            known = ", ".join(self.types) or "none: omit agent"
            raise ToolError(f"unknown sub-agent type {task.agent!r} (known: {known})")
        agent_type = ctx.agent_type if virtual else str(task.agent)
        configured = self.virtual.address if self.virtual else None
        if not virtual:
            configured = self.types[agent_type].address
        try:
            address = configured or resolve_address(agent_type)
        except HelixError as exc:
            raise ToolError(f"{agent_type}: {exc.message}") from exc
        session_id = derived_session_id(ctx.session_id, "task", task_id, ctx.child_scope)
        return DispatchTask(
            task_id=task_id,
            agent_type=agent_type,
            session_id=session_id,
            address=address,
            conversation_key=key_of(ctx, session_id),
            virtual=virtual,
        )

    def _input(self, task: DispatchTask, asked: Task) -> str:
        """What the child is sent: a new child's input JSON, or the next turn's message."""
        if task.turn > 1:
            return asked.message
        field = (
            (self.virtual.input_field if self.virtual else None)
            if task.virtual
            else self.types[task.agent_type].input_field
        )
        return asked.message if field is None else json.dumps({field: asked.message})

    def _options(self, ctx: ToolContext, task: DispatchTask, asked: Task) -> pb.SubagentOptions:
        options = pb.SubagentOptions(virtual=task.virtual)
        options.tools.extend(self._virtual_tools if task.virtual else ())
        if asked.context == "inherit":
            options.context_json = json.dumps(inherited_context(ctx.run.conversation))
        return options

    async def _start(self, ctx: ToolContext, task: DispatchTask, asked: Task) -> None:
        """Start one task (or its conversation's next turn); a failure marks it failed,
        never the batch: the batch is recorded whatever happens to each task, so no
        started child goes unrecorded."""
        # Its delegation span, ended when the parent records how the task ended (_record).
        trace_context = open_delegation(
            ctx, child_session_id=task.session_id, agent_type=task.agent_type
        )
        metadata = child_metadata(ctx, trace_context)
        logged = False
        try:
            client = await ctx.run.clients.get(task.address)
            # A task re-run by a resumed parent: its subagent_start may be in the log.
            rejoined = await ctx.run.store.get_subsession_ref(ctx.session_id, task.session_id)
            logged = rejoined is not None and await start_logged(
                ctx, task.session_id, turn=task.turn
            )
            if rejoined is None:
                new_child(ctx, task.session_id)
            # The ref before the Start, so that an interrupt cascading while the Start
            # is in flight finds the child (see cascade.Cascade).
            await save_ref(ctx, task)
            # An unreachable service is not a failed task: the run's deadline bounds it.
            retry = client.config.reconnect.until_cancelled()
            async with start_window(client):  # a batch's Starts a window at a time
                if task.turn > 1:
                    # Idempotent on the turn: a re-run by a resumed parent rejoins it.
                    reply = await client.continue_session(
                        task.session_id, self._input(task, asked), turn=task.turn, retry=retry
                    )
                    task.from_sequence = reply.from_sequence
                else:
                    await client.start(
                        self._input(task, asked),
                        session_id=task.session_id,
                        parent_session_id=ctx.session_id,
                        metadata=metadata,
                        retry=retry,
                        delegation_path=ctx.child_delegation_path,
                        subagent=self._options(ctx, task, asked),
                        limits=ctx.child_limits(),
                    )
        except HelixError as exc:
            verb = "continue" if task.turn > 1 else "start"
            task.status, task.error = "failed", f"could not {verb}: {exc.message}"
            with contextlib.suppress(HelixError):  # the batch records it failed anyway
                await save_ref(ctx, task)
            end_delegation(
                ctx, child_session_id=task.session_id, status=SessionStatus.FAILED, error=task.error
            )
        if logged:
            return
        ctx.emit(
            subagent_started(
                tool_call_id=ctx.tool_call_id,
                child_id=task.session_id,
                agent_type=task.agent_type,
                address=task.address,
            )
        )

    # --- the step hook ------------------------------------------------------------------

    async def step(self, ctx: ToolContext, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Deliver finished batches; park when the pass ended with a batch out; the deadline."""
        await reopen_delegations(ctx)  # the spans of tasks a stopped run left open
        state = ctx.run.state.dispatch
        # The deadline is per turn: a continued session gets a fresh clock and pass.
        turn = ctx.run.state.turns.turn
        if state.turn != turn:
            state.turn, state.started_at, state.final_pass_step = turn, time.time(), None
            if ctx.run.state.turns.fresh:
                # A fresh turn's conversation never dispatched the earlier tasks: their
                # results would be news to it, and a pass ending would park for them.
                for batch in state.batches:
                    batch.delivered = True
        if state.started_at is None:
            state.started_at = time.time()
        started = state.started_at
        deadline = None if self.run_deadline_s is None else started + self.run_deadline_s
        if state.final_pass_step is not None:
            # The one pass after the deadline is over and the run did not finish.
            assert self.run_deadline_s is not None
            raise RunDeadlineExceeded(self.run_deadline_s)
        out = [b for b in state.batches if not b.delivered]
        pass_ended = bool(messages) and messages[-1].get("content") == NUDGE
        if out and pass_ended:
            await self._park(ctx, out, deadline)
        else:
            await self._refresh(ctx, out)
        if deadline is not None and time.time() >= deadline:
            return await self._deadline(ctx, out, state)
        ready = [b for b in out if all(t.status != "running" for t in b.tasks)]
        return await self._deliver(ctx, ready, heading="[sub-agent results]")

    async def hold_finish(
        self, ctx: ToolContext, messages: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """A ``__finish__`` while ``WAIT`` tasks are out: park until their batches are
        done (or the deadline passes), then give them to the model for one more pass."""
        state = ctx.run.state.dispatch
        waiting = [
            b
            for b in state.batches
            if not b.delivered
            and any(t.status == "running" and self._policy(t) is ClosePolicy.WAIT for t in b.tasks)
        ]
        if not waiting:
            return []
        started = state.started_at or time.time()
        deadline = None if self.run_deadline_s is None else started + self.run_deadline_s
        while any(t.status == "running" for b in waiting for t in b.tasks):
            if deadline is not None and time.time() >= deadline:
                break
            await self._park(ctx, [b for b in waiting if not done(b)], deadline)
        if not all(done(b) for b in waiting):  # the deadline: its own pass, as unheld
            return await self._deadline(ctx, waiting, state)
        for task in (t for b in waiting for t in b.tasks if self._policy(t) is ClosePolicy.WAIT):
            ctx.emit(
                applied(
                    child_session_id=task.session_id,
                    agent_type=task.agent_type,
                    policy=ClosePolicy.WAIT,
                    action=pb.CLOSE_ACTION_WAITED,
                    reason="the parent's __finish__ waited for it",
                )
            )
        held = await self._deliver(ctx, waiting, heading="[sub-agent results before finishing]")
        held[0]["content"] += (
            "\nYour __finish__ was held until these tasks ended: finish again with their "
            "results in mind."
        )
        return held

    def _policy(self, task: DispatchTask) -> ClosePolicy:
        config = self.types.get(task.agent_type)
        return ClosePolicy.TERMINATE if config is None else config.close_policy

    async def _park(
        self, ctx: ToolContext, batches: list[DispatchBatch], deadline: float | None
    ) -> None:
        """Wait until one outstanding batch is done (or the deadline passes).

        Each running task's stream is followed (and forwarded) to its end, so a batch is
        delivered as its last task ends, not at the next poll.
        """
        changed = asyncio.Event()
        running = [(t, b.tool_call_id) for b in batches for t in b.tasks if t.status == "running"]
        suspended: dict[str, BlockedChild] = {}  # by task session id: waiting for input

        def note(session_id: str, child: BlockedChild | None) -> None:
            if child is None:
                suspended.pop(session_id, None)
            else:
                suspended[session_id] = child
            changed.set()

        watchers = [asyncio.create_task(self._watch(ctx, t, call, note)) for t, call in running]
        for watcher in watchers:
            watcher.add_done_callback(lambda _: changed.set())
        try:
            while not any(all(t.status != "running" for t in b.tasks) for b in batches):
                still = {t.session_id for t, _ in running if t.status == "running"}
                if still and still <= suspended.keys():  # nothing to wait for but people
                    raise WaitingForChildren([suspended[s] for s in sorted(still)])
                left = None if deadline is None else deadline - time.time()
                if left is not None and left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await changed.wait()
                changed.clear()
                for watcher in watchers:  # a bug in one fails the run, as it would unparked
                    if watcher.done() and (error := watcher.exception()) is not None:
                        raise error
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _watch(
        self,
        ctx: ToolContext,
        task: DispatchTask,
        tool_call_id: str,
        note: Callable[[str, BlockedChild | None], None],
    ) -> None:
        """Forward ``task``'s events until it ends, then record how. A parked parent
        outlasts a service that stays unreachable past the client's reconnect deadline:
        it follows again; the run's deadline bounds it."""
        while True:
            try:
                client = await ctx.run.clients.get(task.address)
                final = await forward_child(
                    ctx,
                    child_id=task.session_id,
                    tool_call_id=tool_call_id,
                    client=client,
                    retry=client.config.reconnect.until_cancelled(),
                    past=task.from_sequence,  # a continued conversation: this turn's end
                    rejoining=True,  # a task parked before may wait for input already
                    blocked=functools.partial(note, task.session_id),
                )
                # None: the log held all of it already (a resumed parent); ask how it ended.
                status = status_of(final) if final else await client.get_status(task.session_id)
            except SessionNotFound:
                status = _GONE
            except HelixError:
                await asyncio.sleep(UNREACHABLE_PAUSE_S)
                continue
            await self._record(ctx, task, status)
            return

    async def _deadline(
        self, ctx: ToolContext, batches: list[DispatchBatch], state: DispatchState
    ) -> list[dict[str, Any]]:
        state.final_pass_step = ctx.step
        late = [(t, b.tool_call_id) for b in batches for t in b.tasks if t.status == "running"]

        async def stop(task: DispatchTask, tool_call_id: str) -> None:
            with contextlib.suppress(HelixError, TimeoutError):  # best effort: timed out
                client = await ctx.run.clients.get(task.address)
                await client.interrupt(task.session_id, reason="the parent's deadline passed")
                # Its last events (its end) into the log, if they come at once.
                async with asyncio.timeout(DEADLINE_TAIL_S):
                    await forward_child(
                        ctx, child_id=task.session_id, tool_call_id=tool_call_id, client=client
                    )
            task.status, task.error = "timed_out", "the run's deadline passed"
            await save_ref(ctx, task)
            end_span(ctx, task)

        await asyncio.gather(*(stop(t, call) for t, call in late))
        delivered = await self._deliver(ctx, batches, heading="[sub-agent results at the deadline]")
        note = "The run's deadline has passed: give your best answer now, in this step."
        if delivered:
            delivered[0]["content"] += "\n" + note
            return delivered
        return [{"role": "user", "content": note}]

    async def _deliver(
        self, ctx: ToolContext, batches: list[DispatchBatch], *, heading: str
    ) -> list[dict[str, Any]]:
        if not batches:
            return []
        # A delivery re-run by a resumed parent (its subagent_end flushed, its checkpoint
        # not) shows the model the batch again, but logs no second end.
        logged = await ends_logged(ctx, [t.session_id for b in batches for t in b.tasks])
        reports = []
        for batch in batches:
            batch.delivered = True  # durable with the conversation that holds it
            for task in batch.tasks:
                reports.append(report(task))
                if logged[task.session_id] < task.turn:
                    end_event(ctx, batch.tool_call_id, task)
        return [{"role": "user", "content": f"{heading}\n{json.dumps(reports)}"}]

    async def _refresh(self, ctx: ToolContext, batches: list[DispatchBatch]) -> None:
        running = [(t, b.tool_call_id) for b in batches for t in b.tasks if t.status == "running"]
        await asyncio.gather(*(self._read_status(ctx, t, call) for t, call in running))

    async def _read_status(self, ctx: ToolContext, task: DispatchTask, tool_call_id: str) -> None:
        """Forward ``task``'s events up to where its service says it is; record how it
        ended once it has. While its service cannot be reached, still running as far as
        we know (forwarded and recorded at a later step)."""
        try:
            client = await ctx.run.clients.get(task.address)
            status = await client.get_status(task.session_id)
            await forward_child(
                ctx,
                child_id=task.session_id,
                tool_call_id=tool_call_id,
                client=client,
                until=status.last_sequence,
            )
        except SessionNotFound:
            status = _GONE
        except HelixError:
            return
        if status.status not in UNFINISHED:
            await self._record(ctx, task, status)

    async def _record(
        self, ctx: ToolContext, task: DispatchTask, status: pb.GetStatusResponse
    ) -> None:
        """Record how ``task`` ended, in the task and its ref."""
        task.status = SessionStatus.from_proto(status.status).value
        task.output_json = status.output_json
        task.error = status.error
        await save_ref(ctx, task)
        end_span(ctx, task)


def with_dispatch(
    agent: Agent,
    types: Sequence[SubagentType],
    *,
    run_deadline_s: float | None = None,
    virtual: VirtualTasks | None = None,
) -> Agent:
    """``agent`` with the ``run_subagent`` tool (see the module docstring).

    Args:
        agent: the parent.
        types: the agent types a task may name, with their descriptions.
        run_deadline_s: the run's deadline per turn (see "Deadline").
        virtual: let a task name no agent: a one-shot child of ``agent``'s own type.
    """
    return Dispatcher(types, run_deadline_s=run_deadline_s, virtual=virtual).attach(agent)
