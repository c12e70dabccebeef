"""The run loop: step -> model -> tools (concurrently) -> checkpoint -> events.

A run is a function of its checkpoint and its log, never of memory: every step
ends with a checkpoint, and the model's tool calls are checkpointed before the
tools run, so a resumed run repeats the tools of a cut-off step with the same
tool call ids (a remote child started by one is reached again, not duplicated)
instead of asking the model again. (A step whose only call is the finish tool,
which has no effects, is written once, with the run's end: cut off before that,
it asks the model again, as a step cut off during its model call does.)

Contract on cancellation: an interrupt *requested through the store* ends the
run with status ``interrupted`` and an ``interrupted`` event. An external
``asyncio.CancelledError`` (a shutting-down server) propagates unchanged and
leaves the session ``running`` with its last checkpoint, to be resumed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from helix_transport._eventlog import SessionWriter
from helix_transport._exceptions import AgentRunError, HelixError, ModelAPIError
from helix_transport._proto.helix.agent.v1 import agent_pb2 as pb
from helix_transport._status import SessionStatus
from helix_transport._turns import (
    TURN_BASE_KEY,
    TURN_FRESH_KEY,
    TURN_KEY,
    TURN_SEQUENCE_KEY,
    StartedTurn,
    heal,
    read_turns,
    turn_started_at,
)
from helix_transport.agent.definition import Agent
from helix_transport.agent.hooks import NO_HOOKS, RunHooks, guarded
from helix_transport.agent.litellm import stream_completion
from helix_transport.agent.model import ModelResponse, ToolCall, new_tool_call_id
from helix_transport.agent.tools import (
    FINISH_TOOL,
    ToolArgumentError,
    ToolContext,
    ToolError,
    describe_validation_error,
    dump_result,
)
from helix_transport.store import Checkpoint, SessionRecord, SessionUpdate, Store, Usage
from helix_transport.store._records import storable_text
from helix_transport.transport._pool import ClientPool

logger = logging.getLogger("helix.loop")

T = TypeVar("T")

FINISH_INSTRUCTIONS = (
    f"When the task is done, call the `{FINISH_TOOL}` tool with the final output; "
    "its arguments must match its schema exactly."
)
NUDGE = f"Continue the task. To end it, call `{FINISH_TOOL}` with the final output."
MAX_RESULT_BYTES = 1 << 20
"""Largest tool result or output a run logs. Each is one event, and an event must fit in
one gRPC message, also wrapped by every parent that forwards it (4 MiB by default):
a larger one would be logged but could never be streamed, nor anything after it."""

MAX_ERROR_BYTES = 16 << 10
"""Most of an error message a run logs (a tool's, a provider's): a client that puts a whole
response body in its exception must not make an event no stream can send."""


@dataclass(frozen=True)
class _Interrupted:
    pass


INTERRUPTED: Final = _Interrupted()


@dataclass(kw_only=True)
class _RunState:
    step: int
    messages: list[dict[str, Any]]
    usage: Usage = field(default_factory=Usage)
    state: dict[str, Any] = field(default_factory=dict)
    """Free-form run state, checkpointed with the messages (``ToolContext.state``)."""
    error: str = ""
    """Why the run failed, for the hooks (the log and the record have it already)."""


@dataclass(frozen=True, kw_only=True)
class _ToolOutcome:
    message: dict[str, Any]
    output_json: str | None = None


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
    ) -> None:
        self.agent = agent
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
        self._cache: dict[str, Any] = {}  # ToolContext.cache: this run's, for all its tools

    async def run(self, *, resume_reason: str = "") -> SessionStatus:
        """Run (or resume) the session until it completes, fails or is interrupted."""
        state, save = await self._start_or_resume(resume_reason)
        status = SessionStatus.RUNNING  # unless set below: stopped, to be resumed
        try:
            status = await self._steps(state, save=save)
        except AgentRunError as exc:
            status = await self._fail(state, str(exc), exc.failure_reason)
        finally:
            self.hooks.on_run_end(status=status, usage=state.usage, error=state.error)
        return status

    async def _start_or_resume(self, resume_reason: str) -> tuple[_RunState, bool]:
        """The run's state, and whether it needs a checkpoint before its first step."""
        record = self.record
        if record.last_sequence == 0:  # a new run (no checkpoint without run_started)
            self.writer.emit(
                pb.StreamEvent(
                    run_started=pb.RunStarted(
                        input_json=record.input_json,
                        parent_session_id=record.parent_session_id,
                        metadata=record.metadata,
                    )
                )
            )
            # No checkpoint before step 1: it would hold only what the record's input
            # gives (see _initial), so the first model call does not wait for a write.
            state = _RunState(step=0, messages=self._initial().messages)
            self.hooks.on_run_start(resumed=False, step=1)
            return state, False
        # None saved: the run ended or died before its first step's checkpoint. Its
        # start is that checkpoint (a resumed run emits run_resumed, not run_started).
        checkpoint = await self.store.load_checkpoint(self.session_id) or self._initial()
        # A continued session: a turn committed after the checkpoint begins now.
        pending = await read_turns(self.store, self.session_id, after=checkpoint.last_sequence)
        if pending:
            return await self._begin_turn(checkpoint, pending[-1], resume_reason)
        self.writer.step = checkpoint.step + 1
        self.writer.emit(_resumed(checkpoint.step + 1, resume_reason))
        self.hooks.on_run_start(resumed=True, step=checkpoint.step + 1)
        await self._resumed_turn(checkpoint)
        state = _RunState(
            step=checkpoint.step,
            messages=list(checkpoint.messages),
            usage=checkpoint.usage,
            state=dict(checkpoint.state),
        )
        return state, False

    def _initial(self) -> Checkpoint:
        """The checkpoint a run has before its first step: its input, nothing done."""
        # The model sees the validated input, defaults filled in.
        model = self.agent.input_model.model_validate_json(self.record.input_json)
        messages = self._first_messages(model.model_dump_json())
        return Checkpoint(session_id=self.session_id, step=0, messages=messages)

    def _first_messages(self, user: str) -> list[dict[str, Any]]:
        system = "\n\n".join(p for p in (self.agent.system_prompt, FINISH_INSTRUCTIONS) if p)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def _begin_turn(
        self, checkpoint: Checkpoint, turn: StartedTurn, resume_reason: str
    ) -> tuple[_RunState, bool]:
        """Start a continued session's new turn (see ``helix_transport._turns``)."""
        # Steps go on numbering across turns; the budget counts from the turn's start.
        base = max(checkpoint.step, self.record.step_count)
        if turn.fresh:
            messages = self._first_messages(turn.message)
        else:
            messages = await heal(
                self.store,
                self.session_id,
                list(checkpoint.messages),
                after=checkpoint.last_sequence,
                until=turn.sequence,
            )
            messages.append({"role": "user", "content": turn.message})
        state = _RunState(
            step=base,
            messages=messages,
            usage=checkpoint.usage,
            state={
                **checkpoint.state,
                TURN_KEY: turn.turn,
                TURN_BASE_KEY: base,
                TURN_SEQUENCE_KEY: turn.sequence,  # so Continue need not read the log for it
                TURN_FRESH_KEY: turn.fresh,
            },
        )
        self.writer.step = base + 1
        if resume_reason:  # the process that accepted the turn died before it began
            self.writer.emit(_resumed(base + 1, resume_reason))
        self.hooks.on_run_start(resumed=bool(resume_reason), step=base + 1)
        self.hooks.on_turn_start(turn=turn.turn, message=turn.message, fresh=turn.fresh)
        return state, True

    async def _resumed_turn(self, checkpoint: Checkpoint) -> None:
        """Tell the hooks which turn a resumed run is in, when it is not the first: one
        read of its ``turn_started``, and none without hooks (tracing off)."""
        at = checkpoint.state.get(TURN_SEQUENCE_KEY)
        if at is None or self.hooks is NO_HOOKS:
            return
        try:
            turn = await turn_started_at(self.store, self.session_id, int(at))
        except HelixError:  # only the trace would show it; the run's own reads will tell
            logger.warning("session %s: its turn's message is not traced", self.session_id)
            return
        if turn is not None:
            self.hooks.on_turn_start(turn=turn.turn, message=turn.message, fresh=turn.fresh)

    async def _steps(self, state: _RunState, *, save: bool) -> SessionStatus:
        reason = await self._boundary(state, save=save)
        while True:
            if reason is not None:
                return await self._end_interrupted(state, reason)
            if state.step - int(state.state.get(TURN_BASE_KEY, 0)) >= self.agent.max_steps:
                return await self._fail(
                    state, f"no output after {self.agent.max_steps} steps", "max_steps"
                )
            step = state.step + 1
            self.writer.step = step
            outcome = await self._race(self._step(state))
            if outcome is INTERRUPTED:
                taking = asyncio.ensure_future(self.store.take_interrupt(self.session_id))
                return await self._end_interrupted(state, await self._taken(taking))
            state.step = step
            if isinstance(outcome, str):
                return await self._complete(state, outcome)
            reason = await self._boundary(state)

    async def _boundary(self, state: _RunState, *, save: bool = True) -> str | None:
        """Between steps: the checkpoint (with ``save``) and the interrupt check, side by
        side (one store round trip's wait, not two). Returns the interrupt's reason."""
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

    async def _taken(self, check: asyncio.Future[str | None]) -> str | None:
        """The interrupt ``check`` takes from the store. Cancelled meanwhile (a drain, a
        lost lease), this run puts it back: the store may have cleared it already."""
        try:
            return await asyncio.shield(check)
        except asyncio.CancelledError:
            await asyncio.shield(self._put_back(check))
            raise

    async def _end_interrupted(self, state: _RunState, reason: str | None) -> SessionStatus:
        """End the run interrupted; if that write is refused (another replica took the
        session over), the interrupt taken from the store goes back for the run that
        goes on."""
        try:
            return await self._interrupted(state, reason or "")
        except BaseException:
            if reason is None:
                raise
            taken: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            taken.set_result(reason)
            await self._put_back(taken)
            raise

    async def _put_back(self, check: asyncio.Future[str | None]) -> None:
        try:
            reason = await check
            if reason is not None:
                await self.store.set_interrupt(self.session_id, reason)
        except Exception:
            logger.warning(
                "session %s: an interrupt may be lost with the failed checkpoint",
                self.session_id,
                exc_info=True,
            )

    async def _step(self, state: _RunState) -> str | None:
        """One step; returns the output JSON when the run is done."""
        calls = _unanswered_tool_calls(state.messages)
        if calls is None:  # a fresh step (not one cut off after its model call)
            self.writer.emit(pb.StreamEvent(step_started=pb.StepStarted()))
            for hook in self.agent.step_hooks:  # e.g. notices of children that finished
                state.messages.extend(await hook(self._tool_context(state, ""), state.messages))
            response = _with_unique_call_ids(await self._call_model(state), state.messages)
            state.usage = state.usage + response.usage
            state.messages.append(response.to_message())
            calls = response.tool_calls
            if any(c.name != FINISH_TOOL for c in calls):
                # Durable before any tool runs: a resume re-runs these same calls.
                await self._checkpoint(state, step=state.step)
        if not calls:
            state.messages.append({"role": "user", "content": NUDGE})
            return None
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._run_tool(state, c)) for c in calls]
        outcomes = [t.result() for t in tasks]
        state.messages.extend(o.message for o in outcomes)
        return next((o.output_json for o in outcomes if o.output_json is not None), None)

    async def _call_model(self, state: _RunState) -> ModelResponse:
        emit = self.writer.emit
        model = self.agent.resolved_model()
        self.hooks.on_generation_start(model=model, messages=state.messages)
        started = time.monotonic()
        response: ModelResponse | None = None
        try:
            response = await stream_completion(
                model=model,
                messages=state.messages,
                tools=self.agent.tool_schemas(),
                on_text=lambda text: emit(pb.StreamEvent(text_delta=pb.TextDelta(text=text))),
                settings=self.agent.model_settings,
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

    async def _run_tool(self, state: _RunState, call: ToolCall) -> _ToolOutcome:
        # The finish tool's events, its output and the run's end go in one write.
        finishing = call.name == FINISH_TOOL
        self.writer.emit(
            pb.StreamEvent(
                tool_start=pb.ToolStart(
                    tool_call_id=call.id, tool_name=call.name, arguments_json=call.arguments_json
                )
            ),
            defer=finishing,
        )
        self.hooks.on_tool_start(
            name=call.name, tool_call_id=call.id, arguments_json=call.arguments_json
        )
        output_json: str | None = None
        try:
            if finishing:
                output = self.agent.output_model.model_validate_json(call.arguments_json or "{}")
                output_json = self._within_limit(output.model_dump_json(), "the output")
                result, is_error = json.dumps({"ok": True}), False
            else:
                result = await self._call_tool(state, call)
                result, is_error = self._within_limit(result, f"tool {call.name!r}'s result"), False
        except ValidationError as exc:
            problem = clipped(f"invalid output: {describe_validation_error(exc)}")
            # Recoverable: the model sees the problem and gets another step.
            self.writer.emit(pb.StreamEvent(error=pb.Error(message=problem, code="invalid_output")))
            result, is_error = json.dumps({"error": problem}), True
        except ToolError as exc:
            result, is_error = json.dumps({"error": clipped(exc.message)}), True
        except TimeoutError:
            result, is_error = json.dumps({"error": f"tool {call.name!r} timed out"}), True
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is None or current.cancelling():
                raise  # the step is being cancelled (an interrupt, a lost lease, a drain)
            # The tool's own doing (it awaited a task it had cancelled, say): its
            # failure, as any other error, not an interrupt of the whole run.
            logger.warning("tool %s cancelled itself in session %s", call.name, self.session_id)
            result, is_error = json.dumps({"error": "CancelledError: the tool was cancelled"}), True
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit and a library's own BaseExceptions too
            # A failing tool is the model's problem to handle, not the run's (and not
            # the process's: sys.exit() in one tool must not stop every session).
            logger.warning(
                "tool %s failed in session %s", call.name, self.session_id, exc_info=True
            )
            result, is_error = json.dumps({"error": clipped(f"{type(exc).__name__}: {exc}")}), True
        self.writer.emit(
            pb.StreamEvent(
                tool_end=pb.ToolEnd(
                    tool_call_id=call.id, tool_name=call.name, result_json=result, is_error=is_error
                )
            ),
            defer=output_json is not None,  # the run ends with this step: _complete writes it
        )
        self.hooks.on_tool_end(
            name=call.name, tool_call_id=call.id, result_json=result, is_error=is_error
        )
        message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result}
        return _ToolOutcome(message=message, output_json=output_json)

    def _within_limit(self, text: str, what: str) -> str:
        """``text``, or ``ToolError`` when it is too large to log as one event."""
        most = self.max_result_bytes
        if len(text) * 4 > most and len(encoded := text.encode()) > most:  # cheap when small
            raise ToolError(
                f"{what} is {len(encoded)} bytes, over the {most} bytes one event may carry: "
                "return less (a summary, or where to find the rest)"
            )
        return text

    async def _call_tool(self, state: _RunState, call: ToolCall) -> str:
        tool = self.agent.tool(call.name)
        if tool is None:
            known = ", ".join(t.name for t in self.agent.tools) or "none"
            raise ToolArgumentError(call.name, f"no such tool (available: {known}, {FINISH_TOOL})")
        args = tool.parse_args(call.arguments_json)
        ctx = self._tool_context(state, call.id)
        async with asyncio.timeout(tool.timeout_s):
            return dump_result(await tool.fn(ctx, args))

    def _tool_context(self, state: _RunState, tool_call_id: str) -> ToolContext:
        return ToolContext(
            session_id=self.session_id,
            agent_type=self.agent.name,
            tool_call_id=tool_call_id,
            step=state.step + 1,
            metadata=self.record.metadata,
            emit=self.writer.emit,
            emit_encoded=self.writer.emit_encoded,
            flush=self.writer.flush,
            store=self.store,
            clients=self.clients,
            hooks=self.hooks,
            state=state.state,
            cache=self._cache,
            principal=self.record.principal,
            tenant=self.record.tenant,
            max_live_children=self.agent.max_live_children,
        )

    async def _race(self, work: Awaitable[T]) -> T | _Interrupted:
        """Run ``work`` unless an interrupt arrives first, then cancel it."""
        task = asyncio.ensure_future(work)
        signal = asyncio.ensure_future(self.interrupt_signal.wait())
        try:
            await asyncio.wait({task, signal}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            signal.cancel()
            if not task.done():
                task.cancel()
                # Wait for the step to unwind (an in-flight model call is cancelled).
                await asyncio.wait({task})
        if task.cancelled():
            if signal.done() and not signal.cancelled():
                return INTERRUPTED
            # Cancelled from within, not by an interrupt: that is a crash, not a stop.
            raise RuntimeError("the step was cancelled without an interrupt")
        return task.result()

    async def _checkpoint(self, state: _RunState, *, step: int | None = None) -> None:
        done = state.step if step is None else step
        # The record's progress and the checkpoint ride with the step's events: one
        # write, not three. The writer sets where the checkpoint's log ends.
        await self.writer.flush(
            SessionUpdate(step_count=done, usage=state.usage),
            checkpoint=Checkpoint(
                session_id=self.session_id,
                step=done,
                messages=state.messages,
                usage=state.usage,
                state=_storable(state.state),
            ),
        )

    async def _complete(self, state: _RunState, output_json: str) -> SessionStatus:
        self.writer.emit(pb.StreamEvent(output=pb.Output(output_json=output_json)), defer=True)
        await self.writer.finish(
            pb.StreamEvent(completed=pb.Completed(output_json=output_json)),
            SessionUpdate(
                status=SessionStatus.COMPLETED,
                output_json=output_json,
                step_count=state.step,
                usage=state.usage,
            ),
            # The whole conversation, its last step included: what a new turn
            # (Continue) starts from. It rides with the end: still one write.
            checkpoint=Checkpoint(
                session_id=self.session_id,
                step=state.step,
                messages=state.messages,
                usage=state.usage,
                state=_storable(state.state),
            ),
        )
        return SessionStatus.COMPLETED

    async def _fail(self, state: _RunState, error: str, reason: str) -> SessionStatus:
        error = clipped(storable_text(error))  # the event says what the record will
        state.error = error
        await self.writer.finish(
            pb.StreamEvent(failed=pb.Failed(error=error, failure_reason=reason)),
            SessionUpdate(
                status=SessionStatus.FAILED,
                error=error,
                failure_reason=reason,
                step_count=state.step,
                usage=state.usage,
            ),
        )
        return SessionStatus.FAILED

    async def _interrupted(self, state: _RunState, reason: str) -> SessionStatus:
        await self.writer.finish(
            pb.StreamEvent(interrupted=pb.Interrupted(reason=reason)),
            SessionUpdate(
                status=SessionStatus.INTERRUPTED, step_count=state.step, usage=state.usage
            ),
        )
        return SessionStatus.INTERRUPTED


def clipped(text: str, most: int = MAX_ERROR_BYTES) -> str:
    """``text`` cut to about ``most`` UTF-8 bytes, saying how much was cut."""
    if len(text) * 4 <= most:  # cheap when small
        return text
    encoded = text.encode("utf-8", "replace")  # a lone surrogate counts as one byte
    if len(encoded) <= most:
        return text
    kept = encoded[:most].decode("utf-8", "ignore")
    return f"{kept}… ({len(encoded) - len(kept.encode('utf-8', 'replace'))} bytes cut)"


class _StateNotJSON(AgentRunError):
    failure_reason = "invalid_state"


def _storable(state: dict[str, Any]) -> dict[str, Any]:
    """``state``, checked to be JSON before a checkpoint carries it to the store.

    A tool that leaves another value there (a set, an object) fails the run with a
    clear error; the store would refuse the checkpoint, and the run would crash and
    resume into the same refusal.
    """
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise _StateNotJSON(f"ToolContext.state must hold JSON values only: {exc}") from None
    return state


def _resumed(step: int, reason: str) -> pb.StreamEvent:
    """A resumed run's first event: the step that starts again, and why."""
    return pb.StreamEvent(run_resumed=pb.RunResumed(step=step, reason=reason or "restart"))


def _with_unique_call_ids(response: ModelResponse, messages: list[dict[str, Any]]) -> ModelResponse:
    """``response`` with every tool call id new to the conversation.

    Children are named after their tool call (``{parent}-remote-{id}``): a provider that
    repeats an id (``call_0`` at every step) would make a later call rejoin an earlier
    call's child and get its result. A repeat gets an id of our own before the step's
    checkpoint, so a resumed run re-runs the call under the same id.
    """
    if not response.tool_calls:
        return response
    used = {
        c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or ()
    }
    calls = []
    for call in response.tool_calls:
        if call.id in used:
            call = replace(call, id=new_tool_call_id())
        used.add(call.id)
        calls.append(call)
    if calls == response.tool_calls:
        return response
    return replace(response, tool_calls=calls)


def _unanswered_tool_calls(messages: list[dict[str, Any]]) -> list[ToolCall] | None:
    """The tool calls of a step cut off after its model call, or ``None``."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return None
    return [
        ToolCall(id=c["id"], name=c["function"]["name"], arguments_json=c["function"]["arguments"])
        for c in last["tool_calls"]
    ]
