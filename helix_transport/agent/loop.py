"""The run loop: step -> model -> tools (concurrently) -> checkpoint -> events.

A run is a function of its checkpoint and its log, never of memory: every step
ends with a checkpoint, and the model's tool calls are checkpointed before the
tools run, so a resumed run repeats the tools of a cut-off step with the same
tool call ids (a remote child started by one is reached again, not duplicated)
instead of asking the model again. (A step whose only call is the finish tool,
which has no effects, is written once, with the run's end: cut off before that,
it asks the model again, as a step cut off during its model call does.)

Contract on cancellation: an interrupt *requested through the store* ends the
run with status ``interrupted`` and an ``interrupted`` event (an abort: status
``terminated`` and a ``terminated`` event, never resumed). An external
``asyncio.CancelledError`` (a shutting-down server) propagates unchanged and
leaves the session ``running`` with its last checkpoint, to be resumed.

Each step turns the model's answer into a ``NextStep`` (``agent._steps``) and the loop
matches on it. Where a run begins is ``agent._start``; running one tool call is
``agent._tool_runner``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from helix_transport._events import SessionStatus
from helix_transport._exceptions import AgentRunError, HelixError, ModelAPIError, UsageError
from helix_transport._limits import DEADLINE_EXCEEDED
from helix_transport._metadata import split_metadata
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport.agent._endings import Endings
from helix_transport.agent._last_pass import LastPass, answer_cut_off
from helix_transport.agent._start import RunStart
from helix_transport.agent._step_inputs import StepInputs, suspended_event
from helix_transport.agent._steps import (
    FINISH_INSTRUCTIONS,
    NUDGE,
    CallTools,
    FinalOutput,
    Interrupted,
    RunAgain,
    RunProgress,
    Suspend,
    storable,
    unanswered_tool_calls,
    with_unique_call_ids,
)
from helix_transport.agent._tool_runner import (
    MAX_ERROR_BYTES,
    MAX_RESULT_BYTES,
    ToolOutcome,
    ToolRunner,
    clipped,
)
from helix_transport.agent.blockage import Blockage, BlockedChild, WaitingForChildren
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NO_HOOKS, RunHooks, guarded
from helix_transport.agent.inputs import InputState, WaitingChild, only
from helix_transport.agent.interrupt_signal import InterruptSignal
from helix_transport.agent.limits import LAST_PASS_GRACE_S, LimitReached, LimitWatch
from helix_transport.agent.litellm import LitellmModel
from helix_transport.agent.model import Model, ModelResponse, ToolCall, model_name
from helix_transport.agent.run_cache import RunCache
from helix_transport.agent.tools import FINISH_TOOL, RunServices, ToolContext
from helix_transport.log import SessionWriter
from helix_transport.store import (
    Checkpoint,
    Interrupt,
    SessionRecord,
    SessionUpdate,
    Store,
)
from helix_transport.transport import ClientPool

# The loop's constants stay importable from here (the server, dispatch, the bench).
__all__ = [
    "FINISH_INSTRUCTIONS",
    "MAX_ERROR_BYTES",
    "MAX_RESULT_BYTES",
    "NUDGE",
    "RunLoop",
    "clipped",
]

logger = logging.getLogger("helix.loop")

T = TypeVar("T")


class RunLoop:
    """Runs one session of one agent to a terminal status."""

    def __init__(
        self,
        agent: Agent,
        record: SessionRecord,
        *,
        store: Store,
        writer: SessionWriter,
        interrupt_signal: asyncio.Event,
        clients: ClientPool,
        hooks: RunHooks = NO_HOOKS,
        max_result_bytes: int = MAX_RESULT_BYTES,
        stop_children: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._metadata, self._lineage = split_metadata(record.metadata)
        if self._lineage.virtual_tools is not None:  # a virtual sub-agent: its parent's subset
            keep = set(self._lineage.virtual_tools)
            agent = dataclasses.replace(agent, tools=[t for t in agent.tools if t.name in keep])
        self.agent = agent
        self._stop_children = stop_children
        """Interrupt the session's running children, with a reason (through the outbox)."""
        self.max_result_bytes = max_result_bytes
        """Tool results and outputs above this are refused, as errors the model sees."""
        self.record = record
        self.store = store
        self.writer = writer
        self.interrupt_signal = interrupt_signal
        self.clients = clients
        self.hooks = guarded(hooks)
        """Lifecycle hooks (tracing); whatever they raise is logged and swallowed."""
        self.session_id = record.session_id
        self._log_has_older_children = True  # until run() knows (the safe default)
        self._cache: dict[str, Any] = {}  # ToolContext.cache: this run's, for all its tools
        self._library_cache = RunCache()  # RunServices.cache: the library's own
        self.watch = LimitWatch(
            record.limits,
            is_root=not record.parent_session_id,
            children=self._library_cache.child_totals,
        )
        self.tools = ToolRunner(
            agent,
            session_id=self.session_id,
            writer=writer,
            hooks=self.hooks,
            max_result_bytes=max_result_bytes,
        )
        self._path = [*self._lineage.session_path, writer.event_session_id]
        self.inputs = StepInputs(
            agent,
            session_id=self.session_id,
            path=self._path,
            store=store,
            writer=writer,
            tools=self.tools,
            hooks=self.hooks,
        )
        self._blockage = Blockage()  # the current step's (see _run_calls)
        self.endings = Endings(
            agent,
            session_id=self.session_id,
            store=store,
            writer=writer,
            totals=self._library_cache.child_totals,
        )
        """How the run ends (the terminal writes, and the close policies' commands)."""

    async def run(self, *, resume_reason: str = "") -> SessionStatus:
        """Run (or resume) the session until it completes, fails or is interrupted."""
        start = RunStart(
            self.agent, self.record, store=self.store, writer=self.writer, hooks=self.hooks
        )
        state, save = await start.state(resume_reason)
        self._resumed_from_suspension(state, resume_reason)
        # A run that began this session forwards every child itself; any other may find
        # children's ends in the log from before it (see _usage).
        self._log_has_older_children = bool(resume_reason) or state.run.turns.turn > 1
        self.endings.read_log_first = self._log_has_older_children
        self.endings.children_possible = self._log_has_older_children  # until a ToolContext
        self.watch.own = state.usage
        if self.watch.active and self._log_has_older_children:  # the subtree, counted once
            await self.watch.children.read_log(self.store, self.session_id)
        status = SessionStatus.RUNNING  # unless set below: stopped, to be resumed
        try:
            status = await self._steps(state, save=save)
        except AgentRunError as exc:
            status = await self.endings.fail(state, str(exc), exc.failure_reason)
        finally:
            self.hooks.on_run_end(status=status, usage=state.usage, error=state.error)
        return status

    async def _steps(self, state: RunProgress, *, save: bool) -> SessionStatus:
        interrupt = await self._boundary(state, save=save)
        while True:
            if interrupt is not None:
                return await self._end_interrupted(state, interrupt)
            if limit := self.watch.exceeded():
                return await self._limit_reached(state, limit)
            if state.step - state.run.turns.base_step >= self.agent.max_steps:
                return await self.endings.fail(
                    state, f"no output after {self.agent.max_steps} steps", "max_steps"
                )
            step = state.step + 1
            self.writer.step = step
            match await self._race(self._step(state)):
                case Interrupted():
                    taking = asyncio.ensure_future(self.store.take_interrupt(self.session_id))
                    return await self._end_interrupted(state, await self._taken(taking))
                case FinalOutput(output_json=output_json):
                    state.step = step
                    try:
                        # No hook, nothing to hold: no race (two tasks a call) for it.
                        held = (
                            await self._race(self._held(state)) if self.agent.finish_hooks else []
                        )
                    except WaitingForChildren as parked:  # its tasks all wait for people
                        blocked = {c.child_session_id: c for c in parked.children}
                        return await self._suspend(state, blocked)
                    if isinstance(held, Interrupted):
                        taking = asyncio.ensure_future(self.store.take_interrupt(self.session_id))
                        return await self._end_interrupted(state, await self._taken(taking))
                    if isinstance(held, LimitReached):
                        return await self._limit_reached(state, held.limit)
                    if not held:
                        return await self.endings.complete(state, output_json)
                    # Held (a WAIT close policy): one more pass, with what it waited for.
                    state.messages.extend(held)
                    interrupt = await self._boundary(state)
                case RunAgain():
                    state.step = step
                    interrupt = await self._boundary(state)
                case Suspend(blocked=blocked):
                    return await self._suspend(state, blocked)
                case LimitReached(limit=limit):
                    return await self._limit_reached(state, limit)

    async def _boundary(self, state: RunProgress, *, save: bool = True) -> Interrupt | None:
        """Between steps: the checkpoint (with ``save``) and the interrupt check, side by
        side (one store round trip's wait, not two). Returns the interrupt taken."""
        check = asyncio.ensure_future(self.store.take_interrupt(self.session_id))
        try:
            if save:
                await self._checkpoint(state)
        except BaseException:
            # Not ours to run any more (or the store failed): an interrupt the check
            # took goes back for whoever runs the session next.
            await self._put_back(check)
            raise
        return await self._taken(check)

    async def _taken(self, check: asyncio.Future[Interrupt | None]) -> Interrupt | None:
        """The interrupt ``check`` takes from the store. Cancelled meanwhile (a drain, a
        lost lease), this run puts it back: the store may have cleared it already."""
        try:
            return await asyncio.shield(check)
        except asyncio.CancelledError:
            await asyncio.shield(self._put_back(check))
            raise

    async def _end_interrupted(
        self, state: RunProgress, interrupt: Interrupt | None
    ) -> SessionStatus:
        """End the run interrupted (terminated, for an abort); if that write is refused
        (another replica took the session over), the interrupt taken from the store goes
        back for the run that goes on."""
        try:
            return await self.endings.interrupted(state, interrupt or Interrupt())
        except BaseException:
            if interrupt is None:
                raise
            taken: asyncio.Future[Interrupt | None] = asyncio.get_running_loop().create_future()
            taken.set_result(interrupt)
            await self._put_back(taken)
            raise

    async def _put_back(self, check: asyncio.Future[Interrupt | None]) -> None:
        try:
            interrupt = await check
            if interrupt is not None:
                await self.store.set_interrupt(
                    self.session_id, interrupt.reason, abort=interrupt.abort
                )
        except Exception:
            logger.warning(
                "session %s: an interrupt may be lost with the failed checkpoint",
                self.session_id,
                exc_info=True,
            )

    async def _step(self, state: RunProgress) -> FinalOutput | RunAgain | Suspend:
        """One step: decide (ask the model, or take a cut-off step's calls), then act."""
        match await self._next_step(state):
            case RunAgain() as again:
                state.messages.append({"role": "user", "content": NUDGE})
                return again
            case CallTools(calls=calls):
                return await self._call_tools(state, calls)
            case Suspend() as suspend:
                return suspend

    async def _next_step(self, state: RunProgress) -> CallTools | RunAgain | Suspend:
        """What the step does, durable before it acts (tool calls with effects are
        checkpointed first, so a resume re-runs these same calls)."""
        calls = unanswered_tool_calls(state.messages)
        if calls is None:  # a fresh step (not one cut off after its model call)
            self.writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))
            try:
                for hook in self.agent.step_hooks:  # e.g. notices of children that finished
                    context = self._tool_context(state, "")
                    state.messages.extend(await hook(context, state.messages))
            except WaitingForChildren as parked:  # a parked batch whose tasks all wait
                return Suspend(blocked={c.child_session_id: c for c in parked.children})
            response = with_unique_call_ids(await self._call_model(state), state.messages)
            self._count(state, response)
            state.messages.append(response.to_message())
            calls = response.tool_calls
            if any(c.name != FINISH_TOOL for c in calls):
                # Requests for input are in the checkpoint before anyone sees them. A
                # fresh step starts clean: what an interrupted earlier step kept is over.
                waiting = InputState()
                self.inputs.ask(waiting, calls)
                waiting.save(state.run)
                await self._checkpoint(state, step=state.step)
        return CallTools(calls) if calls else RunAgain()

    async def _call_tools(
        self, state: RunProgress, calls: list[ToolCall]
    ) -> FinalOutput | RunAgain | Suspend:
        """Run the step's calls concurrently (those waiting for input once answered); the
        finish tool's valid output ends the run. A step that still waits for input when
        nothing else runs suspends (``agent._step_inputs``)."""
        waiting = InputState.of(state.run)
        only(waiting, {c.id for c in calls})
        before = (len(waiting.pending), len(waiting.results))
        ready = await self.inputs.resolve(waiting, calls, from_sequence=state.from_sequence)
        if (len(waiting.pending), len(waiting.results)) != before:
            # Answers applied, approved calls handed over: never again after a crash.
            waiting.save(state.run)
            await self._checkpoint(state, step=state.step)
        outcomes, blocked = await self._run_calls(state, ready, set(waiting.started))
        for call_id, outcome in outcomes.items():
            waiting.results[call_id] = outcome.message
            if outcome.output_json is not None:
                waiting.output_json = outcome.output_json
        if waiting.pending or blocked:
            waiting.save(state.run)
            return Suspend(blocked=blocked)
        state.messages.extend(waiting.results[c.id] for c in calls)
        InputState().save(state.run)  # the step is whole: nothing to keep
        output = waiting.output_json
        return RunAgain() if output is None else FinalOutput(output)

    async def _run_calls(
        self, state: RunProgress, calls: list[ToolCall], at_most_once: set[str]
    ) -> tuple[dict[str, ToolOutcome], dict[str, BlockedChild]]:
        """Run ``calls`` concurrently until each has an outcome or waits only for a
        suspended child; returns the outcomes and the blocked calls. The results of
        ``at_most_once`` calls are durable as soon as they return."""
        if not calls:
            return {}, {}
        if all(c.name == FINISH_TOOL for c in calls):
            # The finish tool only validates: it never waits for a child, so it needs
            # no task of its own nor a watch for blocked calls (two tasks a call).
            context = functools.partial(self._tool_context, state)
            outcomes = {
                c.id: await self.tools.run(c, context, record=c.id in at_most_once) for c in calls
            }
            return outcomes, {}
        blockage = self._blockage = Blockage()
        async with asyncio.TaskGroup() as group:
            tasks = {
                c.id: group.create_task(
                    self.tools.run(
                        c,
                        lambda call_id: self._tool_context(state, call_id),
                        record=c.id in at_most_once,
                    )
                )
                for c in calls
            }
            settling = group.create_task(blockage.settle(tasks))
        cancelled = settling.result()
        outcomes = {cid: t.result() for cid, t in tasks.items() if not t.cancelled()}
        blocked = {cid: cancelled[cid] for cid, t in tasks.items() if t.cancelled()}
        return outcomes, blocked

    async def _held(self, state: RunProgress) -> list[dict[str, Any]]:
        """The messages of the first finish hook that holds the run's completion."""
        for hook in self.agent.finish_hooks:
            held = await hook(self._tool_context(state, ""), state.messages)
            if held:
                return held
        return []

    def _count(self, state: RunProgress, response: ModelResponse) -> None:
        """Add a model call's usage (and its price, where known) to the run's."""
        usage = response.usage
        if response.cost_usd is not None:
            usage = dataclasses.replace(usage, cost_usd=response.cost_usd)
        state.usage = self.watch.own = state.usage + usage

    async def _call_model(self, state: RunProgress, *, finish_only: bool = False) -> ModelResponse:
        try:
            config = self.agent.model_config()
        except UsageError as exc:  # a bad HELIX_MODEL_*/HELIX_LLM_* value: say which
            raise ModelAPIError(model_name(self.agent.model), str(exc)) from exc
        model = config.model
        completer: Model = self.agent.plugged_model() or LitellmModel(model)
        shown = self._shown(state)
        self.hooks.on_generation_start(model=model, messages=shown)
        started = time.monotonic()
        response: ModelResponse | None = None
        try:
            response = await completer.complete(
                shown,
                tools=self.agent.tool_schemas()[-1:] if finish_only else self.agent.tool_schemas(),
                on_text=self.writer.emit_text,  # each fragment straight to its encoded event
                # Retries, timeout and fallbacks (per type, by env) over the extras.
                settings={**self.agent.model_settings, **config.litellm_settings()},
                metadata={"session_id": self.session_id, "agent_type": self.agent.name},
            )
            return response
        except HelixError:  # ModelAPIError, or the log refusing a write (SequenceConflict)
            raise
        except Exception as exc:  # a provider bug must still end as a clear failure
            raise ModelAPIError(model, f"{type(exc).__name__}: {exc}") from exc
        finally:
            latency_s = time.monotonic() - started
            self.hooks.on_generation_end(model=model, output=response, latency_s=latency_s)

    def _shown(self, state: RunProgress) -> list[dict[str, Any]]:
        """The messages the model is sent: the conversation, and in a sub-agent's first
        turn the parent's context it inherited, after the system prompt. Never stored:
        a later turn, or the session's history, holds only its own conversation."""
        inherited = self._lineage.inherited_context
        if not inherited or state.run.turns.turn != 1:
            return state.messages
        head = 1 if state.messages and state.messages[0].get("role") == "system" else 0
        return [*state.messages[:head], *inherited, *state.messages[head:]]

    def _tool_context(self, state: RunProgress, tool_call_id: str) -> ToolContext:
        self.endings.children_possible = True  # whatever holds it may start a child
        return ToolContext(
            session_id=self.session_id,
            agent_type=self.agent.name,
            tool_call_id=tool_call_id,
            step=state.step + 1,
            metadata=self._metadata,  # the caller's entries only
            emit=self.writer.emit,
            run=RunServices(
                store=self.store,
                clients=self.clients,
                flush=self.writer.flush,
                emit_encoded=self.writer.emit_encoded,
                hooks=self.hooks,
                state=state.run,
                cache=self._library_cache,
                max_live_children=self.agent.max_live_children,
                limits=self.watch,
                blockage=self._blockage,
                session_path=tuple(self._path),
                lineage=self._lineage,
                conversation=state.messages,
            ),
            state=state.state,
            cache=self._cache,
            principal=self.record.principal,
            tenant=self.record.tenant,
        )

    async def _race(
        self, work: Awaitable[T], *, deadline: bool = True
    ) -> T | Interrupted | LimitReached:
        """Run ``work`` unless an interrupt (or, with ``deadline``, the session's deadline)
        comes first, then cancel it."""
        task = asyncio.ensure_future(work)
        interrupts = self.interrupt_signal
        signal: asyncio.Future[Any]
        if isinstance(interrupts, InterruptSignal):  # the server's: no task on the event
            signal = interrupts.watch()
        else:
            signal = asyncio.ensure_future(interrupts.wait())
        limit = ""
        try:
            timeout = self.watch.seconds_left() if deadline else None
            await asyncio.wait({task, signal}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and not signal.done():  # the deadline came first
                limit = DEADLINE_EXCEEDED
                if self.watch.is_root:  # its children's ends may still come in
                    await self._stop_running_children(limit)
                    await asyncio.wait(
                        {task, signal},
                        timeout=LAST_PASS_GRACE_S,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
        finally:
            if isinstance(interrupts, InterruptSignal):
                interrupts.unwatch(signal)
            signal.cancel()
            if not task.done():
                task.cancel()
                # Wait for the step to unwind (an in-flight model call is cancelled).
                await asyncio.wait({task})
        if task.cancelled():
            if signal.done() and not signal.cancelled():
                return Interrupted()
            if limit:
                return LimitReached(limit)
            # Cancelled from within, not by an interrupt: that is a crash, not a stop.
            raise RuntimeError("the step was cancelled without an interrupt")
        return task.result()

    async def _checkpoint(
        self, state: RunProgress, *, step: int | None = None, status: SessionStatus | None = None
    ) -> None:
        done = state.step if step is None else step
        # The record's progress and the checkpoint ride with the step's events: one
        # write, not three. The writer sets where the checkpoint's log ends.
        await self.writer.flush(
            SessionUpdate(step_count=done, usage=state.usage, status=status),
            checkpoint=Checkpoint(
                session_id=self.session_id,
                step=done,
                messages=state.messages,
                usage=state.usage,
                state=storable(state),
            ),
        )

    async def _suspend(self, state: RunProgress, blocked: dict[str, BlockedChild]) -> SessionStatus:
        """Stop running until input arrives: the step's state, the ``suspended`` event and
        the status in one write. No task, no lease, nothing in memory stays behind."""
        waiting = InputState.of(state.run)
        waiting.children = [
            WaitingChild(
                child_session_id=b.child_session_id,
                address=b.address,
                last_sequence=b.last_sequence,
            )
            for b in blocked.values()
        ]
        waiting.suspended_at = time.time()
        waiting.save(state.run)
        self.writer.emit(suspended_event(waiting, len(blocked)))
        await self._checkpoint(state, status=SessionStatus.SUSPENDED)
        self.hooks.on_suspended(request_ids=list(waiting.pending), suspended_children=len(blocked))
        return SessionStatus.SUSPENDED

    def _resumed_from_suspension(self, state: RunProgress, reason: str) -> None:
        """A run woken from a suspension: tell the hooks how long it waited, and forget
        what it waited for (it looks again)."""
        waiting = InputState.of(state.run)
        if waiting.suspended_at is None:
            return
        self.hooks.on_resumed(reason=reason or "restart", suspended_at=waiting.suspended_at)
        waiting.suspended_at = None
        waiting.children = []
        waiting.save(state.run)

    async def _limit_reached(self, state: RunProgress, limit: str) -> SessionStatus:
        """A limit is exceeded: the session's running children are asked to stop; a child
        session ends INTERRUPTED, a root one gets one last pass to answer with what it has.
        """
        logger.info("session %s: %s", self.session_id, limit)
        answer_cut_off(state, limit, self.writer)
        await self._stop_running_children(limit)
        if not self.watch.is_root:
            return await self.endings.interrupted(state, Interrupt(reason=limit), limit=limit)
        last_pass = LastPass(
            writer=self.writer,
            call_model=lambda: self._call_model(state, finish_only=True),
            count=lambda response: self._count(state, response),
            run_tool=lambda call: self.tools.run(call, lambda cid: self._tool_context(state, cid)),
        )
        match await self._race(last_pass.run(state, limit), deadline=False):
            case str() as output_json:
                return await self.endings.complete(state, output_json, limit=limit)
            case Interrupted():
                taking = asyncio.ensure_future(self.store.take_interrupt(self.session_id))
                return await self._end_interrupted(state, await self._taken(taking))
            case _:
                reason = f"{limit}: no valid answer in the last pass"
                return await self.endings.interrupted(state, Interrupt(reason=reason), limit=limit)

    async def _stop_running_children(self, limit: str) -> None:
        if self._stop_children is not None:
            await self._stop_children(limit)
